package io.streamdp.bench;

import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.streams.processor.TimestampExtractor;

/** Event time from the decoded event's {@code timestamp} field (ms), as stream-dp and Faust. */
final class EventTime implements TimestampExtractor {
  @Override
  public long extract(ConsumerRecord<Object, Object> record, long partitionTime) {
    if (record.value() instanceof Event event) {
      return event.timestampMs();
    }
    return record.timestamp(); // internal topics (the partials) carry their own times
  }
}
