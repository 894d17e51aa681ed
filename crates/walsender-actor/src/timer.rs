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
