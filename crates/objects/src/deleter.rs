//! Deletes objects the tier no longer needs (parts of a segment's older
//! generations, parts hidden entirely by newer ones) in the background, in
//! bulk requests of at most `delete_batch_objects_max` keys, one request at a
//! time so that deleting never competes with reads and flushes for more than
//! one permit. A failed batch is tried again after `delete_retry_delay_ms`;
//! what a crash leaves undeleted the next open finds again (as older
//! generations or hidden parts) and queues anew.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use crate::requests::CountedStore;

#[derive(Default)]
struct Queue {
    keys: Vec<String>,
    /// Keys of the batch being deleted now.
    in_flight: usize,
}

/// The keys waiting for deletion, shared by the device and its deleter task.
#[derive(Default)]
pub struct DeletionQueue {
    queue: Mutex<Queue>,
    wake: Notify,
}

impl DeletionQueue {
    pub fn push(&self, keys: impl IntoIterator<Item = String>) {
        let mut queue = self.queue.lock().expect("deletion queue lock");
        let before = queue.keys.len();
        queue.keys.extend(keys);
        if queue.keys.len() > before {
            self.wake.notify_one();
        }
    }

    /// Keys queued or being deleted.
    pub fn awaiting(&self) -> usize {
        let queue = self.queue.lock().expect("deletion queue lock");
        queue.keys.len() + queue.in_flight
    }

    fn take_batch(&self, objects_max: usize) -> Vec<String> {
        let mut queue = self.queue.lock().expect("deletion queue lock");
        let start = queue.keys.len().saturating_sub(objects_max);
        let batch = queue.keys.split_off(start);
        queue.in_flight = batch.len();
        batch
    }

    fn finish_batch(&self, failed: Vec<String>) {
        let mut queue = self.queue.lock().expect("deletion queue lock");
        queue.in_flight = 0;
        queue.keys.extend(failed);
    }
}

/// Runs until aborted (the device's drop aborts it).
pub async fn run_deleter(
    queue: Arc<DeletionQueue>,
    store: Arc<CountedStore>,
    batch_objects_max: usize,
    retry_delay: Duration,
    url: String,
) {
    loop {
        let batch = queue.take_batch(batch_objects_max);
        if batch.is_empty() {
            queue.finish_batch(Vec::new());
            queue.wake.notified().await;
            continue;
        }
        let count = batch.len();
        match store.delete_many(batch.clone()).await {
            Ok(()) => {
                tracing::debug!(tier = %url, objects = count, "deleted objects no longer needed");
                queue.finish_batch(Vec::new());
            }
            Err(error) => {
                tracing::warn!(tier = %url, objects = count, %error, "background delete failed; trying again later");
                queue.finish_batch(batch);
                tokio::time::sleep(retry_delay).await;
            }
        }
    }
}
