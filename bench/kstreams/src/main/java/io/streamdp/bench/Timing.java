package io.streamdp.bench;

/**
 * When the first, the latest and the last expected event were taken by the stream thread (it
 * alone writes; the main thread and the window closers read).
 */
final class Timing {
  private final long expectedEvents;
  private volatile long events;
  private volatile long firstNanos;
  private volatile long lastNanos;
  private volatile long latestNanos;

  Timing(long expectedEvents) {
    this.expectedEvents = expectedEvents;
  }

  void noteEvent() {
    long now = System.nanoTime();
    if (events == 0) {
      firstNanos = now;
    }
    latestNanos = now;
    events = events + 1;
    if (events == expectedEvents) {
      lastNanos = now;
    }
  }

  long events() {
    return events;
  }

  long firstNanos() {
    return firstNanos;
  }

  /** When the stream thread last took an event, from any partition (0 before the first). */
  long latestNanos() {
    return latestNanos;
  }

  long lastNanos() {
    return lastNanos == 0 ? System.nanoTime() : lastNanos;
  }
}
