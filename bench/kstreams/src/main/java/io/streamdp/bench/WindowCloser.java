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
 * partial: its users and their bounded counts summed, read from the windowed store.
 *
 * <p>A window closes when the task's stream time (its latest event time) minus grace passes the
 * window's end. Kafka Streams advances stream time only with new records, so the last window of
 * a stream that falls silent would never close by event time; as in stream-dp (and the Faust
 * peer), once the partition has been idle for idle_close_s of wall-clock time, its watermark
 * advances with the wall clock from its latest event time. This is what {@code
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
  private long lastWindowSeenMs = Long.MIN_VALUE;
  private long lastEventNanos;

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
    context.schedule(IDLE_CHECK, PunctuationType.WALL_CLOCK_TIME, now -> closeIdle());
  }

  @Override
  public void process(Record<Windowed<String>, Long> record) {
    timing.noteEvent();
    lastEventNanos = System.nanoTime();
    lastWindowSeenMs = Math.max(lastWindowSeenMs, record.key().window().start());
    closeUpTo(context.currentStreamTimeMs() - graceMs);
  }

  private void closeIdle() {
    if (lastEventNanos == 0) {
      return;
    }
    long idleNanos = System.nanoTime() - lastEventNanos;
    if (idleNanos >= idleCloseNanos) {
      closeUpTo(context.currentStreamTimeMs() + idleNanos / 1_000_000 - graceMs);
    }
  }

  /** Forward a partial for every window seen here that ends at or before the watermark. */
  private void closeUpTo(long watermarkMs) {
    while (nextWindowMs <= lastWindowSeenMs && nextWindowMs + sizeMs <= watermarkMs) {
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
      context.forward(new Record<>(nextWindowMs, new Counts(1, users, events), end - 1));
      nextWindowMs = end;
    }
  }
}
