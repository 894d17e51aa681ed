//! One wake-up per thread for a watch that another thread publishes.
//!
//! Storage's writer thread publishes the WAL position on a `tokio::sync::watch` after every
//! flush. Each receiver that waits on it is woken on its own: for a task of an actix thread
//! that is one `eventfd` write by the writer and, when both share a CPU, one switch to the
//! actor thread and back, for every subscriber (a node's walsenders, its walreceiver, its
//! visibility task). [`relayed`] gives the subscribers of one thread a watch of that thread's
//! own, fed by one task that follows the other thread's watch: the publisher then wakes each
//! thread once per value, and the relay wakes its thread's subscribers from inside the thread,
//! which costs no system call.
//!
//! A relayed receiver behaves as a receiver of the watch itself: it starts with the watch's
//! current value marked seen, is told of every value the relay sees (values the publisher
//! replaced before the relay ran are skipped, as a watch skips them for any slow receiver),
//! and sees the channel closed once the publisher's last sender is gone. The relay ends when
//! the watch closes or its thread's last relayed receiver is dropped, whichever comes first;
//! a later subscription starts a new one. A relay also ends with its thread's runtime, so a
//! relayed receiver belongs on the thread that took it (an actor's own stream, a task of that
//! thread): taken to another thread, it would see the watch closed once the first stops.
//!
//! Outside an actix thread (a plain thread, another runtime) there is no thread's task set to
//! run a relay on, and [`relayed`] returns the receiver it was given.

use std::any::Any;
use std::cell::RefCell;
use std::rc::Rc;

use tokio::sync::watch;

/// One relay of this thread: the watch it follows (a receiver kept only to recognise the
/// channel; it does not keep the channel open) and the thread's own watch it feeds.
struct Relay<T> {
    upstream: watch::Receiver<T>,
    local: Rc<watch::Sender<T>>,
}

thread_local! {
    /// This thread's relays, of any value type; a handful at most (one per storage opening
    /// the thread's actors follow), so a search by channel is cheap.
    static RELAYS: RefCell<Vec<Rc<dyn Any>>> = const { RefCell::new(Vec::new()) };
}

/// A receiver of `fresh`'s watch through this thread's relay of it, started if there is none.
///
/// `fresh` is a receiver as `watch::Sender::subscribe` returns it (its current value seen);
/// the receiver returned starts the same way. On a thread that is not an actix thread,
/// `fresh` itself is returned.
pub fn relayed<T>(fresh: watch::Receiver<T>) -> watch::Receiver<T>
where
    T: Clone + PartialEq + 'static,
{
    if actix::Arbiter::try_current().is_none() {
        return fresh;
    }
    RELAYS.with(|relays| {
        let mut relays = relays.borrow_mut();
        let found = relays.iter().find_map(|r| {
            r.downcast_ref::<Relay<T>>()
                .filter(|r| r.upstream.same_channel(&fresh))
                .map(|r| r.local.clone())
        });
        if let Some(local) = found {
            // The relay may not have run since the last value was published: bring the
            // thread's watch up to it, so that the new receiver starts where `fresh` does.
            let now = fresh.borrow().clone();
            local.send_if_modified(|v| {
                let changed = *v != now;
                if changed {
                    *v = now;
                }
                changed
            });
            return local.subscribe();
        }
        let (tx, rx) = watch::channel(fresh.borrow().clone());
        let local = Rc::new(tx);
        let relay: Rc<dyn Any> = Rc::new(Relay {
            upstream: fresh.clone(),
            local: local.clone(),
        });
        relays.push(relay.clone());
        actix::spawn(follow(fresh, local, relay));
        rx
    })
}

/// The relay's task: passes on each value of `upstream` until it closes or nobody on this
/// thread listens. However it ends (also when its runtime is dropped with it), it forgets its
/// relay, dropping the thread's watch, so that no later subscriber finds a relay that nothing
/// feeds.
fn follow<T>(
    mut upstream: watch::Receiver<T>,
    local: Rc<watch::Sender<T>>,
    me: Rc<dyn Any>,
) -> impl std::future::Future<Output = ()>
where
    T: Clone + 'static,
{
    // Made before the task first runs: a runtime dropped before it polled the task drops
    // the guard with it.
    let forget = Forget(me);
    async move {
        let _forget = forget;
        loop {
            tokio::select! {
                changed = upstream.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    let v = upstream.borrow_and_update().clone();
                    local.send_replace(v);
                }
                () = local.closed() => break,
            }
        }
    }
}

/// Removes a relay from its thread's list when dropped.
struct Forget(Rc<dyn Any>);

impl Drop for Forget {
    fn drop(&mut self) {
        // While the thread exits its list may already be gone, and that is all right.
        let _ = RELAYS.try_with(|relays| {
            if let Ok(mut relays) = relays.try_borrow_mut() {
                relays.retain(|r| !Rc::ptr_eq(r, &self.0));
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Waits for `rx` to see `want`, failing after a deadline instead of hanging.
    async fn sees(rx: &mut watch::Receiver<u64>, want: u64) {
        let waited = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            rx.wait_for(|v| *v == want),
        )
        .await;
        assert!(matches!(waited, Ok(Ok(_))), "never saw {want}");
    }

    #[actix_rt::test]
    async fn the_subscribers_of_a_thread_share_one_relay_and_see_every_value() {
        let (tx, _keep) = watch::channel(1u64);
        let mut a = relayed(tx.subscribe());
        let mut b = relayed(tx.subscribe());
        assert!(
            a.same_channel(&b),
            "both receivers should be on the thread's relay"
        );
        assert!(!a.same_channel(&tx.subscribe()));
        assert_eq!(*a.borrow(), 1);
        // Published from another thread, as storage's writer does.
        let tx = std::sync::Arc::new(tx);
        let t = tx.clone();
        std::thread::spawn(move || t.send_replace(2))
            .join()
            .expect("publisher thread");
        sees(&mut a, 2).await;
        sees(&mut b, 2).await;
        RELAYS.with(|r| assert_eq!(r.borrow().len(), 1));
    }

    #[actix_rt::test]
    async fn a_new_subscriber_starts_at_the_current_value_and_has_seen_it() {
        let (tx, _keep) = watch::channel(1u64);
        let _first = relayed(tx.subscribe());
        // Published before the relay could run: the second subscriber starts there anyway.
        tx.send_replace(5);
        let mut second = relayed(tx.subscribe());
        assert_eq!(*second.borrow(), 5);
        assert!(
            !second.has_changed().expect("open"),
            "the current value counts as seen"
        );
        tx.send_replace(6);
        sees(&mut second, 6).await;
    }

    #[actix_rt::test]
    async fn the_relayed_watch_closes_with_the_publisher() {
        let (tx, rx) = watch::channel(1u64);
        let mut a = relayed(rx);
        tx.send_replace(2);
        drop(tx);
        sees(&mut a, 2).await;
        let closed = tokio::time::timeout(std::time::Duration::from_secs(10), a.changed()).await;
        assert!(
            matches!(closed, Ok(Err(_))),
            "the relayed watch should close"
        );
        RELAYS.with(|r| assert!(r.borrow().is_empty(), "the relay should be gone"));
    }

    #[actix_rt::test]
    async fn the_relay_ends_when_its_thread_stops_listening() {
        let (tx, _keep) = watch::channel(1u64);
        let a = relayed(tx.subscribe());
        drop(a);
        // The relay hears the last receiver go (no value needs to be sent) and ends at its
        // next turn; a few turns of this task give it that.
        let mut turns = 0;
        while RELAYS.with(|r| !r.borrow().is_empty()) && turns < 1000 {
            tokio::task::yield_now().await;
            turns += 1;
        }
        let gone = RELAYS.with(|r| r.borrow().is_empty());
        assert!(gone, "the relay should end without listeners");
        // A later subscription starts a new relay that works.
        let mut b = relayed(tx.subscribe());
        tx.send_replace(100);
        sees(&mut b, 100).await;
    }

    #[test]
    fn a_relay_of_a_stopped_system_is_not_found_by_the_next_one() {
        let (tx, _keep) = watch::channel(1u64);
        actix_rt::System::new().block_on(async {
            let _a = relayed(tx.subscribe());
            RELAYS.with(|r| assert_eq!(r.borrow().len(), 1));
        });
        RELAYS.with(|r| {
            assert!(
                r.borrow().is_empty(),
                "the dropped relay should be forgotten"
            )
        });
        actix_rt::System::new().block_on(async {
            let mut b = relayed(tx.subscribe());
            tx.send_replace(7);
            sees(&mut b, 7).await;
        });
    }

    #[test]
    fn off_an_actix_thread_the_receiver_is_returned_as_it_is() {
        let (tx, _keep) = watch::channel(1u64);
        let rx = relayed(tx.subscribe());
        assert!(rx.same_channel(&tx.subscribe()));
        RELAYS.with(|r| assert!(r.borrow().is_empty()));
    }
}
