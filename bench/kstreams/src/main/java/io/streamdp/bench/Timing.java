package io.streamdp.bench;

/** When the first and the last expected event were aggregated (one stream thread writes). */
final class Timing {
  private final long expectedEvents;
  private volatile long events;
  private volatile long firstNanos;
  private volatile long lastNanos;

  Timing(long expectedEvents) {
    this.expectedEvents = expectedEvents;
  }

  void noteEvent() {
    long now = System.nanoTime();
    if (events == 0) {
      firstNanos = now;
    }
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

  long lastNanos() {
    return lastNanos == 0 ? System.nanoTime() : lastNanos;
  }
}
