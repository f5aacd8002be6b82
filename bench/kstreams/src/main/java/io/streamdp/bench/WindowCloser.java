package io.streamdp.bench;

import java.time.Duration;
import java.time.Instant;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.kstream.Windowed;
import org.apache.kafka.streams.processor.PunctuationType;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.KeyValueIterator;
import org.apache.kafka.streams.state.TimestampedWindowStore;
import org.apache.kafka.streams.state.ValueAndTimestamp;

/**
 * Closes the windows of one input partition (one task) and forwards each closed window's
 * partial: its users and their bounded counts summed, read from the windowed store (through its
 * record cache, so the counts are current).
 *
 * <p>Every 50 ms of wall-clock time, and on every update the aggregate forwards, it compares the
 * task's stream time (its latest event time: the stream is in event-time order per partition,
 * so every event of a window has been aggregated once stream time is past the window's end) with
 * the windows still open. A window closes when the stream time minus grace passes its end.
 *
 * <p>Kafka Streams advances stream time only with new records, so the last window of a stream
 * that falls silent would never close by event time. As in stream-dp and the Faust peer, once
 * the whole stream (every partition: the one stream thread has taken no event) has been idle for
 * idle_close_s of wall-clock time, the watermark advances with the wall clock from the latest
 * event time; and only once every event of the preloaded topic has been taken (the reader is at
 * the end of every partition, as stream-dp requires a fetch at the log's end): on Apache Kafka
 * under load the stream thread has been seen to take no event for more than 15 s in mid-stream,
 * which closed three windows before their last events were read. Idleness is the whole stream's, not one partition's: a partition that only waits
 * while the thread serves the others (or while the machine is busy) is not idle, and closing
 * its window then would miss events still to come. This is what {@code
 * suppress(untilWindowCloses)} does on event time, plus the idle close it lacks.
 */
final class WindowCloser implements Processor<Windowed<String>, Long, Long, Counts> {
  private static final Duration IDLE_CHECK = Duration.ofMillis(50);

  private final Timing timing;
  private final long sizeMs;
  private final long graceMs;
  private final long idleCloseNanos;
  private ProcessorContext<Long, Counts> context;
  private TimestampedWindowStore<String, Long> store;
  private long nextWindowMs;

  WindowCloser(Settings settings, Timing timing) {
    this.timing = timing;
    this.sizeMs = settings.windowSizeS * 1000;
    this.graceMs = settings.graceS * 1000;
    this.idleCloseNanos = (long) (settings.idleCloseS * 1e9);
    this.nextWindowMs = settings.startS * 1000;
  }

  @Override
  public void init(ProcessorContext<Long, Counts> context) {
    this.context = context;
    this.store = context.getStateStore(KStreamsPeer.COUNTS_STORE);
    context.schedule(IDLE_CHECK, PunctuationType.WALL_CLOCK_TIME, now -> check());
  }

  @Override
  public void process(Record<Windowed<String>, Long> record) {
    check();
  }

  private void check() {
    long streamTimeMs = context.currentStreamTimeMs();
    if (streamTimeMs < 0) {
      return; // no event yet
    }
    long watermarkMs = streamTimeMs - graceMs;
    long idleNanos = System.nanoTime() - timing.latestNanos();
    if (timing.allTaken() && idleNanos >= idleCloseNanos) {
      watermarkMs += idleNanos / 1_000_000;
    }
    // Windows up to the one holding the latest event, so a silent stream emits no empty ones.
    long lastWindowMs = Math.floorDiv(streamTimeMs, sizeMs) * sizeMs;
    closeUpTo(watermarkMs, lastWindowMs);
  }

  /** Forward a partial for every window up to lastWindowMs that ends by the watermark. */
  private void closeUpTo(long watermarkMs, long lastWindowMs) {
    while (nextWindowMs <= lastWindowMs && nextWindowMs + sizeMs <= watermarkMs) {
      long users = 0;
      long events = 0;
      try (KeyValueIterator<Windowed<String>, ValueAndTimestamp<Long>> it =
          store.fetchAll(Instant.ofEpochMilli(nextWindowMs), Instant.ofEpochMilli(nextWindowMs))) {
        while (it.hasNext()) {
          KeyValue<Windowed<String>, ValueAndTimestamp<Long>> entry = it.next();
          users += 1;
          events += entry.value.value();
        }
      }
      long end = nextWindowMs + sizeMs;
      context.forward(
          new Record<>(nextWindowMs, Counts.of(context.taskId().partition(), users, events), end - 1));
      nextWindowMs = end;
    }
  }
}
