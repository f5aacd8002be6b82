package io.streamdp.bench;

import java.nio.ByteBuffer;
import org.apache.kafka.common.serialization.Deserializer;
import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.serialization.Serializer;

/** A window's users and bounded events, over the input partitions that reported it so far. */
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

  Counts plus(Counts other) {
    return new Counts(partitions + other.partitions, users + other.users, events + other.events);
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
