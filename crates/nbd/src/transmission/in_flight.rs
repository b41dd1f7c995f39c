//! The requests in flight on one connection: a slab of futures that the
//! connection's own task polls, each slot with a waker of its own that queues
//! the slot and wakes the connection. Only woken slots are polled, so a deep
//! queue costs nothing while it waits. Slots are reused: a slot keeps its box
//! and its waker once the connection has needed it, so a new request costs no
//! allocation (a `FuturesUnordered` allocates a node per request, and wakes its
//! own task whenever it has polled every future once, which on a multi-thread
//! runtime puts the connection back through the scheduler and may wake another
//! worker, the very handoff this module exists to avoid).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Wake, Waker};

use futures_util::task::AtomicWaker;

/// What the slots' wakers share with the connection.
#[derive(Default)]
struct Readiness {
    /// Slots woken since the connection last polled them.
    woken: Mutex<Vec<usize>>,
    /// The connection task, woken when a slot is.
    connection: AtomicWaker,
}

impl Readiness {
    fn woken(&self) -> MutexGuard<'_, Vec<usize>> {
        // Every update is one push or one swap: a poisoned list is intact.
        self.woken.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The waker of one slot.
struct SlotWaker {
    index: usize,
    /// Whether the slot is in `Readiness::woken` already (so it is there once).
    queued: AtomicBool,
    readiness: Arc<Readiness>,
}

impl SlotWaker {
    /// Queues the slot; true when it was not queued yet.
    fn queue(&self) -> bool {
        if self.queued.swap(true, Ordering::AcqRel) {
            return false;
        }
        self.readiness.woken().push(self.index);
        true
    }
}

impl Wake for SlotWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if self.queue() {
            self.readiness.connection.wake();
        }
    }
}

struct Slot<F> {
    /// The request's future; `None` while the slot is free. The box is kept
    /// for the next request.
    future: Pin<Box<Option<F>>>,
    state: Arc<SlotWaker>,
    waker: Waker,
}

/// Futures of one kind, polled when woken, completed in any order.
pub(crate) struct InFlight<F> {
    slots: Vec<Slot<F>>,
    /// Indexes of free slots.
    free: Vec<usize>,
    readiness: Arc<Readiness>,
    /// The woken slots being polled now; swapped with `Readiness::woken` so
    /// that neither list allocates once grown.
    polling: Vec<usize>,
    running_count: usize,
}

impl<F: Future> InFlight<F> {
    pub(crate) fn new() -> Self {
        InFlight {
            slots: Vec::new(),
            free: Vec::new(),
            readiness: Arc::new(Readiness::default()),
            polling: Vec::new(),
            running_count: 0,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.running_count == 0
    }

    /// Adds a future; it is first polled by the next [`InFlight::poll_completed`].
    pub(crate) fn push(&mut self, future: F) {
        let index = self.free.pop().unwrap_or_else(|| self.new_slot());
        let slot = &mut self.slots[index];
        assert!(slot.future.is_none(), "a free slot holds no future");
        slot.future.as_mut().set(Some(future));
        // The caller is the connection's task and polls next: no wake.
        slot.state.queue();
        self.running_count += 1;
    }

    fn new_slot(&mut self) -> usize {
        let index = self.slots.len();
        let state = Arc::new(SlotWaker {
            index,
            queued: AtomicBool::new(false),
            readiness: Arc::clone(&self.readiness),
        });
        self.slots.push(Slot {
            future: Box::pin(None),
            waker: Waker::from(Arc::clone(&state)),
            state,
        });
        index
    }

    /// Polls every woken future once and hands each completed one's output to
    /// `completed`; true when any completed. The task of `context` is woken
    /// when a future is.
    pub(crate) fn poll_completed(
        &mut self,
        context: &Context<'_>,
        mut completed: impl FnMut(F::Output),
    ) -> bool {
        self.readiness.connection.register(context.waker());
        std::mem::swap(&mut *self.readiness.woken(), &mut self.polling);
        let mut any = false;
        let InFlight {
            slots,
            free,
            polling,
            running_count,
            ..
        } = self;
        for index in polling.drain(..) {
            let slot = &mut slots[index];
            // Cleared before the poll, so that a wake during it queues again.
            slot.state.queued.store(false, Ordering::Release);
            // A waker of an earlier, finished future may wake a free slot.
            let Some(future) = slot.future.as_mut().as_pin_mut() else {
                continue;
            };
            if let Poll::Ready(output) = future.poll(&mut Context::from_waker(&slot.waker)) {
                slot.future.as_mut().set(None);
                free.push(index);
                *running_count -= 1;
                any = true;
                completed(output);
            }
        }
        any
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use tokio::sync::oneshot;

    /// One future type for every request of the test, as on a connection.
    async fn answer(receiver: oneshot::Receiver<u32>) -> u32 {
        receiver.await.expect("the test sends every answer")
    }

    #[tokio::test]
    async fn futures_complete_in_any_order_and_slots_are_reused() {
        let mut in_flight = InFlight::new();
        let (first_sender, first) = oneshot::channel::<u32>();
        let (second_sender, second) = oneshot::channel::<u32>();
        in_flight.push(answer(first));
        in_flight.push(answer(second));
        let mut outputs = Vec::new();
        std::future::poll_fn(|context| {
            assert!(!in_flight.poll_completed(context, |output| outputs.push(output)));
            Poll::Ready(())
        })
        .await;
        second_sender.send(2).unwrap();
        std::future::poll_fn(|context| {
            in_flight.poll_completed(context, |output| outputs.push(output));
            Poll::Ready(())
        })
        .await;
        assert_eq!(outputs, vec![2]);
        assert_eq!(in_flight.running_count, 1);
        first_sender.send(1).unwrap();
        std::future::poll_fn(|context| {
            in_flight.poll_completed(context, |output| outputs.push(output));
            Poll::Ready(())
        })
        .await;
        assert_eq!(outputs, vec![2, 1]);
        assert!(in_flight.is_empty());
        assert_eq!(in_flight.slots.len(), 2);
        let (third_sender, third) = oneshot::channel::<u32>();
        in_flight.push(answer(third));
        third_sender.send(3).unwrap();
        std::future::poll_fn(|context| {
            in_flight.poll_completed(context, |output| outputs.push(output));
            Poll::Ready(())
        })
        .await;
        assert_eq!(outputs, vec![2, 1, 3]);
        assert_eq!(in_flight.slots.len(), 2, "a free slot was reused");
    }
}
