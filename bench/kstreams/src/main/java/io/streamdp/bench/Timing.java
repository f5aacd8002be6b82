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

  /**
   * Whether every event of the preloaded topic has been taken: the peer's way of knowing that its
   * reader is at the end of every partition (stream-dp counts silence as idleness only where a
   * fetch found its reader at the log's end).
   */
  boolean allTaken() {
    return events >= expectedEvents;
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
