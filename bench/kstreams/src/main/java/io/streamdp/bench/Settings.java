package io.streamdp.bench;

import com.fasterxml.jackson.databind.JsonNode;

/** The peer's settings, from the bench's JSON spec (bench/kstreams.py writes it). */
final class Settings {
  final String topic;
  final String outputTopic;
  final int partitions;
  final int outputPartitions;
  final long windowSizeS;
  final long graceS;
  final double idleCloseS;
  final long startS;
  final long k;
  final long expectedEvents;
  final int expectedWindows;
  final double timeoutS;

  private Settings(JsonNode spec) {
    topic = spec.get("topic").asText();
    outputTopic = spec.get("output_topic").asText();
    partitions = spec.get("partitions").asInt();
    outputPartitions = spec.get("output_partitions").asInt();
    windowSizeS = spec.get("window_size_s").asLong();
    graceS = spec.get("grace_s").asLong();
    idleCloseS = spec.get("idle_close_s").asDouble();
    startS = spec.get("start_s").asLong();
    k = spec.get("k").asLong();
    expectedEvents = spec.get("events").asLong();
    expectedWindows = spec.get("windows").asInt();
    timeoutS = spec.get("timeout_s").asDouble();
  }

  static Settings of(JsonNode spec) {
    return new Settings(spec);
  }
}
