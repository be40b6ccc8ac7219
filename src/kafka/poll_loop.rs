//! The blocking thread that polls librdkafka and forwards what it returns, in order.
//!
//! librdkafka's poll runs callbacks (rebalance, logs, commits) on the polling thread, and the
//! revoke callback blocks until the async side has drained; that must never happen on a
//! runtime worker, so polling has its own OS thread. After each idle poll, and at least every
//! 200 ms, it sends the consumer's positions: sent after the messages they follow, they let
//! the offset tracker move past transaction markers and aborted records.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::Offset;
use tokio::sync::mpsc;

use super::context::ConnectorContext;
use super::ConsumerEvent;
use crate::dispatch::event::TopicPartition;

const POLL_TIMEOUT: Duration = Duration::from_millis(100);
const POSITION_INTERVAL: Duration = Duration::from_millis(200);

/// Starts the poll thread. It stops when `stop` is set or the event receiver is gone; the
/// consumer is closed where its last reference is dropped, which the supervisor arranges to
/// be this thread.
pub(crate) fn spawn_poll_loop(
    connection: &str,
    consumer: Arc<BaseConsumer<ConnectorContext>>,
    events: mpsc::Sender<ConsumerEvent>,
    stop: Arc<AtomicBool>,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(format!("kafka-poll-{connection}"))
        .spawn(move || {
            let mut last_positions = Instant::now();
            while !stop.load(Ordering::SeqCst) {
                let event = match consumer.poll(POLL_TIMEOUT) {
                    Some(Ok(msg)) => Some(ConsumerEvent::Message(msg.detach())),
                    Some(Err(e)) => Some(ConsumerEvent::Error(e)),
                    None => None,
                };
                let idle = event.is_none();
                if let Some(event) = event {
                    if events.blocking_send(event).is_err() {
                        break;
                    }
                }
                if idle || last_positions.elapsed() >= POSITION_INTERVAL {
                    last_positions = Instant::now();
                    if let Ok(tpl) = consumer.position() {
                        let positions: Vec<(TopicPartition, Option<i64>)> = tpl
                            .elements()
                            .iter()
                            .map(|e| {
                                let tp = TopicPartition {
                                    topic: e.topic().to_owned(),
                                    partition: e.partition(),
                                };
                                match e.offset() {
                                    Offset::Offset(o) => (tp, Some(o)),
                                    _ => (tp, None),
                                }
                            })
                            .collect();
                        if !positions.is_empty()
                            && events
                                .blocking_send(ConsumerEvent::Positions(positions))
                                .is_err()
                        {
                            break;
                        }
                    }
                }
            }
            drop(consumer);
        })
}
