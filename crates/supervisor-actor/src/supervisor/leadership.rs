//! The supervisor's side of automatic failover: the messages of [`crate::leadership`].

use actix::prelude::*;

use super::Supervisor;
use crate::leadership::{FollowError, FollowLeader, Followed, PromoteForTerm, SetSyncStandbys};
use crate::supervisor::{PromoteError, Promoted};

impl Handler<PromoteForTerm> for Supervisor {
    type Result = ResponseActFuture<Self, Result<Promoted, PromoteError>>;

    fn handle(&mut self, _: PromoteForTerm, _: &mut Context<Self>) -> Self::Result {
        // Not written yet: the term is not recorded in the history.
        Box::pin(actix::fut::ready(Err(PromoteError::InProgress)))
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
