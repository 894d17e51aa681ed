//! The supervisor's side of automatic failover: the messages of [`crate::leadership`].

use actix::prelude::*;

use super::Supervisor;
use crate::leadership::{FollowError, FollowLeader, Followed, PromoteForTerm, SetSyncStandbys};
use crate::supervisor::{PromoteError, Promoted};

impl Handler<PromoteForTerm> for Supervisor {
    type Result = ResponseActFuture<Self, Result<Promoted, PromoteError>>;

    fn handle(&mut self, msg: PromoteForTerm, _: &mut Context<Self>) -> Self::Result {
        // The term is known from now, whatever the promotion's outcome; the fence stays closed
        // until the failover actor grants it, after the promotion.
        self.fence.observe_term(msg.term);
        self.promote(format!(
            "promoted by walserver failover for term {}",
            msg.term
        ))
    }
}

impl Handler<FollowLeader> for Supervisor {
    type Result = ResponseActFuture<Self, Result<Followed, FollowError>>;

    fn handle(&mut self, _: FollowLeader, _: &mut Context<Self>) -> Self::Result {
        // Not written yet.
        Box::pin(actix::fut::ready(Err(FollowError::InProgress)))
    }
}

impl Handler<SetSyncStandbys> for Supervisor {
    type Result = ();

    fn handle(&mut self, _: SetSyncStandbys, _: &mut Context<Self>) {
        // Not written yet.
    }
}
