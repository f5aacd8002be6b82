package io.streamdp.bench;

import java.nio.ByteBuffer;
import org.apache.kafka.common.serialization.Deserializer;
import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.serialization.Serializer;

/**
 * A window's users and bounded events, over the input partitions that reported it so far
 * ({@code partitions}: one bit per input partition, at most 64).
 *
 * <p>A partition's first report of a window counts and a later one is ignored: a task that is
 * revoked and taken again (a rebalance, e.g. a stream thread that missed its session under load)
 * starts its window closer again and reports the windows it had already reported; summing both
 * would count the partition twice and emit the window before another partition reported it.
 */
final class Counts {
  long partitions;
  long users;
  long events;

  Counts() {}

  Counts(long partitions, long users, long events) {
    this.partitions = partitions;
    this.users = users;
    this.events = events;
  }

  /** One input partition's report. */
  static Counts of(int partition, long users, long events) {
    return new Counts(1L << partition, users, events);
  }

  Counts plus(Counts other) {
    if ((partitions & other.partitions) != 0) {
      return this; // a partition that reported this window already: its first report stands
    }
    return new Counts(partitions | other.partitions, users + other.users, events + other.events);
  }

  int reported() {
    return Long.bitCount(partitions);
  }

  String toJson(long windowStartMs) {
    return "{\"window_start_ms\":" + windowStartMs + ",\"users\":" + users
        + ",\"bounded_events\":" + events + "}";
  }

  static final Serde<Counts> SERDE =
      Serdes.serdeFrom(
          (Serializer<Counts>)
              (topic, c) ->
                  ByteBuffer.allocate(24).putLong(c.partitions).putLong(c.users)
                      .putLong(c.events).array(),
          (Deserializer<Counts>)
              (topic, bytes) -> {
                ByteBuffer b = ByteBuffer.wrap(bytes);
                return new Counts(b.getLong(), b.getLong(), b.getLong());
              });
}
