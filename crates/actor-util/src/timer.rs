//! One timer kept at a state machine's earliest deadline, for the actors that wrap the
//! protocol state machines (the walsender's and the walreceiver's).
//!
//! The state machine says when it next needs to be woken (`next_deadline`); the actor keeps a
//! single `run_later` at that instant. A later deadline leaves the armed timer alone: when it
//! fires early, the state machine finds nothing due and the actor arms it again. So the timer
//! is rearmed at most once per deadline that actually passes, not on every message.

use std::time::Instant;

use actix::prelude::*;

#[derive(Default)]
pub struct DeadlineTimer {
    armed: Option<(Instant, SpawnHandle)>,
}

impl DeadlineTimer {
    /// Makes sure a timer fires at `deadline` or earlier; `fire` runs then, and must call
    /// [`DeadlineTimer::fired`] first.
    pub fn arm<A>(
        &mut self,
        deadline: Option<Instant>,
        ctx: &mut Context<A>,
        fire: impl FnOnce(&mut A, &mut Context<A>) + 'static,
    ) where
        A: Actor<Context = Context<A>>,
    {
        let Some(deadline) = deadline else {
            return;
        };
        if let Some((at, _)) = self.armed {
            if at <= deadline {
                return;
            }
        }
        if let Some((_, handle)) = self.armed.take() {
            ctx.cancel_future(handle);
        }
        let handle = ctx.run_later(deadline.saturating_duration_since(Instant::now()), fire);
        self.armed = Some((deadline, handle));
    }

    /// The armed timer has fired.
    pub fn fired(&mut self) {
        self.armed = None;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Arms the timer at each of `deadlines` (offsets from now) in turn, and records the
    /// offset it was armed for each time it fires; it stops the system at the first firing.
    struct Probe {
        timer: DeadlineTimer,
        deadlines: Vec<Duration>,
        fired_at: std::sync::Arc<std::sync::Mutex<Vec<Instant>>>,
        armed_for: std::sync::Arc<std::sync::Mutex<Option<Instant>>>,
    }

    impl Actor for Probe {
        type Context = Context<Self>;

        fn started(&mut self, ctx: &mut Context<Self>) {
            let now = Instant::now();
            for d in std::mem::take(&mut self.deadlines) {
                self.timer.arm(Some(now + d), ctx, |act, _| {
                    act.timer.fired();
                    act.fired_at.lock().unwrap().push(Instant::now());
                    System::current().stop();
                });
            }
            *self.armed_for.lock().unwrap() = self.timer.armed.map(|(at, _)| at);
        }
    }

    fn run(deadlines: Vec<Duration>) -> (Option<Instant>, Vec<Instant>, Instant) {
        let fired_at = std::sync::Arc::default();
        let armed_for = std::sync::Arc::default();
        let start = Instant::now();
        let sys = System::new();
        sys.block_on(async {
            Probe {
                timer: DeadlineTimer::default(),
                deadlines,
                fired_at: std::sync::Arc::clone(&fired_at),
                armed_for: std::sync::Arc::clone(&armed_for),
            }
            .start();
        });
        sys.run().unwrap();
        let armed = *armed_for.lock().unwrap();
        let fired = fired_at.lock().unwrap().clone();
        (armed, fired, start)
    }

    #[test]
    fn a_later_deadline_leaves_the_armed_timer_alone() {
        let (armed, fired, start) = run(vec![Duration::from_millis(5), Duration::from_secs(3600)]);
        let armed = armed.expect("armed");
        assert!(
            armed < start + Duration::from_secs(1),
            "kept the earlier deadline"
        );
        assert_eq!(fired.len(), 1);
        assert!(fired[0] >= armed);
    }

    #[test]
    fn an_earlier_deadline_replaces_the_armed_timer() {
        let (armed, fired, start) = run(vec![Duration::from_secs(3600), Duration::from_millis(5)]);
        let armed = armed.expect("armed");
        assert!(
            armed < start + Duration::from_secs(1),
            "moved to the earlier deadline"
        );
        // It fired long before the hour: the earlier timer replaced the later one.
        assert_eq!(fired.len(), 1);
        assert!(fired[0] < start + Duration::from_secs(3600));
    }
}
