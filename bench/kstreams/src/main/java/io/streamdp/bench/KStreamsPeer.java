package io.streamdp.bench;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.lang.management.ManagementFactory;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicReference;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.Metric;
import org.apache.kafka.common.MetricName;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.Repartitioned;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.Stores;

/**
 * The Kafka Streams peer of the throughput bench: per-user, per-window bounded event counts.
 *
 * <p>{@code java -cp 'target/*:target/libs/*' io.streamdp.bench.KStreamsPeer SPEC_JSON} prints
 * one JSON line of measurements, like the Python contenders (bench/contenders.py). The topology:
 *
 * <ol>
 *   <li>the input topic, each value decoded from JSON (Jackson) into an {@link Event}; its
 *       record time is the event's {@code timestamp} field ({@link EventTime});
 *   <li>{@code groupByKey} (the bench keys every event by its user id, so no repartition) and
 *       a tumbling event-time window of the bench's size and grace, aggregated into the user's
 *       count in that window, bounded at k (a per-user contribution bound, as the Faust peer and
 *       stream-dp's reservoir of k);
 *   <li>{@link WindowCloser}: when a window closes on a partition (its stream time passes the
 *       window's end plus grace, or, once the whole stream has been idle for idle_close_s, its
 *       latest event time plus the idle time does: stream-dp's rule), it reads the window's
 *       bounded counts from the store and forwards one partial (users, bounded events) keyed
 *       by window start (it needs no record from the aggregate: it looks at the task's stream
 *       time on a wall-clock schedule);
 *   <li>the partials through a repartition topic into a table of window totals; once every
 *       input partition has reported a window, one window record goes to the output topic.
 * </ol>
 *
 * <p>The main thread times the run: from just before {@code KafkaStreams.start()} to the moment
 * its own consumer of the output topic has read the last expected window record.
 */
public final class KStreamsPeer {
  static final String COUNTS_STORE = "bounded-counts";
  static final ObjectMapper JSON = new ObjectMapper();

  private KStreamsPeer() {}

  public static void main(String[] args) throws Exception {
    if (args.length != 1) {
      System.err.println("usage: KStreamsPeer SPEC_JSON");
      System.exit(2);
    }
    JsonNode spec = JSON.readTree(args[0]);
    Settings settings = Settings.of(spec);
    Timing timing = new Timing(settings.expectedEvents);

    long t0 = System.nanoTime();
    double c0 = processCpuSeconds();
    KafkaStreams streams = new KafkaStreams(topology(settings, timing).build(), props(spec));
    AtomicReference<Throwable> failure = new AtomicReference<>();
    streams.setUncaughtExceptionHandler(
        exc -> {
          failure.compareAndSet(null, exc);
          return StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
    streams.start();
    List<JsonNode> windows;
    long tEnd;
    try {
      windows = readWindowRecords(spec, settings, failure);
      tEnd = System.nanoTime();
    } catch (Exception exc) {
      streams.close(Duration.ofSeconds(10));
      throw exc;
    }
    double cpu = processCpuSeconds() - c0;
    long dropped = droppedRecords(streams);

    ObjectNode result = JSON.createObjectNode();
    result.put("events", timing.events());
    result.put("windows", windows.size());
    result.put("seconds", (tEnd - t0) / 1e9);
    result.put("cpu_seconds", cpu);
    result.put("startup_seconds", (timing.firstNanos() - t0) / 1e9);
    result.put("processing_seconds", (timing.lastNanos() - timing.firstNanos()) / 1e9);
    result.put("close_seconds", (tEnd - timing.lastNanos()) / 1e9);
    result.put("dropped_records", dropped);
    ArrayNode records = result.putArray("window_records");
    windows.forEach(records::add);
    System.out.println(JSON.writeValueAsString(result));
    System.out.flush();
    streams.close(Duration.ofSeconds(30));
    streams.cleanUp();
    System.exit(0);
  }

  static StreamsBuilder topology(Settings s, Timing timing) {
    StreamsBuilder builder = new StreamsBuilder();
    Duration size = Duration.ofSeconds(s.windowSizeS);
    Duration grace = Duration.ofSeconds(s.graceS);
    TimeWindows windows = TimeWindows.ofSizeAndGrace(size, grace);
    // Kept for three windows, so a window's counts are still there when it closes.
    Duration retention = size.multipliedBy(3).plus(grace);
    long k = s.k;
    builder.stream(s.topic, Consumed.with(Serdes.String(), Event.SERDE)
            .withTimestampExtractor(new EventTime()))
        .peek((user, event) -> timing.noteEvent())
        .groupByKey(Grouped.with(Serdes.String(), Event.SERDE))
        .windowedBy(windows)
        .aggregate(
            () -> 0L,
            (user, event, count) -> count < k ? count + 1 : count,
            Materialized.<String, Long>as(
                    Stores.inMemoryWindowStore(COUNTS_STORE, retention, size, false))
                .withKeySerde(Serdes.String())
                .withValueSerde(Serdes.Long()))
        .toStream()
        .process(() -> new WindowCloser(s, timing), COUNTS_STORE)
        .repartition(Repartitioned.with(Serdes.Long(), Counts.SERDE).withName("partials"))
        .groupByKey(Grouped.with(Serdes.Long(), Counts.SERDE))
        .aggregate(
            Counts::new,
            (window, partial, total) -> total.plus(partial),
            Materialized.<Long, Counts, KeyValueStore<Bytes, byte[]>>as("window-totals")
                .withKeySerde(Serdes.Long())
                .withValueSerde(Counts.SERDE)
                .withCachingDisabled())
        .toStream()
        .filter((window, total) -> total.reported() == s.partitions)
        .mapValues((window, total) -> total.toJson(window))
        .to(s.outputTopic, Produced.with(Serdes.Long(), Serdes.String()));
    return builder;
  }

  static Properties props(JsonNode spec) {
    Properties p = new Properties();
    p.put(StreamsConfig.APPLICATION_ID_CONFIG, spec.get("app_id").asText());
    p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, spec.get("bootstrap").asText());
    p.put(StreamsConfig.STATE_DIR_CONFIG, spec.get("state_dir").asText());
    // One stream thread: one process, as one stream-dp worker and the Faust peer.
    p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 1);
    p.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 1);
    // Record caches as Kafka Streams' defaults (10 MiB): the window store's updates reach its
    // changelog topic at commits and evictions, not one changelog record per event.
    p.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 1000);
    p.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");
    // A session far above a loaded machine's pauses (it was 2 s): an evicted member's tasks
    // are closed dirty and replayed from their last commit. Kafka Streams also revives a task
    // after a produce or commit times out, and the revived task's windowed aggregate keeps the
    // stream time it had reached, so its re-read records are dropped as "expired window"; no
    // setting prevents that, so the bench repeats such a run (bench/kstreams.py check_run,
    // from this peer's event count and dropped_records).
    p.put(StreamsConfig.consumerPrefix(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG), 30_000);
    p.put(StreamsConfig.consumerPrefix(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG), 3_000);
    // The worker's fetch settings (bench/contenders.py: 4 MiB per partition, 40,000 records).
    p.put(StreamsConfig.consumerPrefix(ConsumerConfig.MAX_PARTITION_FETCH_BYTES_CONFIG),
        4 * 1_048_576);
    p.put(StreamsConfig.consumerPrefix(ConsumerConfig.MAX_POLL_RECORDS_CONFIG), 40_000);
    // The same producer on both brokers: the embedded one has no idempotent producer.
    p.put(StreamsConfig.producerPrefix(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG), false);
    return p;
  }

  /** The output topic's window records, read by a consumer of this process's main thread. */
  static List<JsonNode> readWindowRecords(
      JsonNode spec, Settings s, AtomicReference<Throwable> failure) throws Exception {
    Properties p = new Properties();
    p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, spec.get("bootstrap").asText());
    p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, false);
    p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
    List<JsonNode> found = new ArrayList<>();
    long deadline = System.nanoTime() + (long) (s.timeoutS * 1e9);
    try (KafkaConsumer<byte[], String> consumer =
        new KafkaConsumer<>(p, new ByteArrayDeserializer(), new StringDeserializer())) {
      List<TopicPartition> parts = new ArrayList<>();
      for (int i = 0; i < s.outputPartitions; i++) {
        parts.add(new TopicPartition(s.outputTopic, i));
      }
      consumer.assign(parts);
      consumer.seekToBeginning(parts);
      while (found.size() < s.expectedWindows) {
        Throwable error = failure.get();
        if (error != null) {
          throw new IllegalStateException("the Kafka Streams thread failed", error);
        }
        if (System.nanoTime() > deadline) {
          throw new IllegalStateException(
              "no " + s.expectedWindows + " window records on " + s.outputTopic + " within "
                  + s.timeoutS + " s (found " + found.size() + ")");
        }
        for (ConsumerRecord<byte[], String> r : consumer.poll(Duration.ofMillis(20))) {
          found.add(JSON.readTree(r.value()));
        }
      }
    }
    return found;
  }

  /**
   * Kafka Streams' own count of the records its tasks dropped (the task metric {@code
   * dropped-records-total}; a windowed aggregate's "expired window" skips among them). The bench
   * never sends a late record, so a count above zero means a task replayed records it had
   * already seen: a recovery (see bench/kstreams.py). Only the tasks open at the end are
   * counted (a closed task's metrics go with it); the re-read events show the rest.
   */
  static long droppedRecords(KafkaStreams streams) {
    double total = 0;
    for (Metric m : streams.metrics().values()) {
      MetricName name = m.metricName();
      if (name.name().equals("dropped-records-total")
          && name.group().equals("stream-task-metrics")
          && m.metricValue() instanceof Double value) {
        total += value;
      }
    }
    return (long) total;
  }

  static double processCpuSeconds() {
    var os =
        (com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean();
    return os.getProcessCpuTime() / 1e9;
  }
}
