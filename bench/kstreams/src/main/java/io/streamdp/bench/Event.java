package io.streamdp.bench;

import com.fasterxml.jackson.annotation.JsonIgnoreProperties;
import com.fasterxml.jackson.annotation.JsonProperty;
import com.fasterxml.jackson.databind.ObjectReader;
import java.io.IOException;
import org.apache.kafka.common.errors.SerializationException;
import org.apache.kafka.common.serialization.Deserializer;
import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.serialization.Serializer;

/**
 * One bench event, decoded from its JSON value (every field is parsed; the peer keeps the two it
 * uses). The serde's serializer exists only because grouping declares a value serde; no event
 * is written back to Kafka (the input is keyed by user id, so there is no repartition).
 */
@JsonIgnoreProperties(ignoreUnknown = true)
record Event(@JsonProperty("user_id") String userId, @JsonProperty("timestamp") long timestampMs) {
  private static final ObjectReader READER = KStreamsPeer.JSON.readerFor(Event.class);

  static final Serde<Event> SERDE =
      Serdes.serdeFrom(
          (Serializer<Event>)
              (topic, event) -> {
                try {
                  return KStreamsPeer.JSON.writeValueAsBytes(event);
                } catch (IOException exc) {
                  throw new SerializationException(exc);
                }
              },
          (Deserializer<Event>)
              (topic, bytes) -> {
                try {
                  return READER.readValue(bytes);
                } catch (IOException exc) {
                  throw new SerializationException("undecodable bench event", exc);
                }
              });
}
