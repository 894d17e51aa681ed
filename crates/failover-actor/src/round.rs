//! One round at a time, another after it if asked meanwhile.
//!
//! The reconciliation, the leader's member-slot round and the synchronous standby's round
//! each run as one future on the actor, reading state when they begin and writing it when
//! they end. Two of a kind running side by side would act on the same state out of order (a
//! slot dropped by one and made by the other, two promotions asked for one term), and a
//! request that arrives while one runs must not be lost either: what it saw may be what the
//! running round read too early to see. [`Rounds`] says that once.

/// Whether a round runs, and whether another is due after it.
#[derive(Debug, Default)]
pub(crate) struct Rounds {
    running: bool,
    /// Asked while `running`: another round is due when it ends.
    again: bool,
}

impl Rounds {
    /// Asks for a round. `true`: none runs, so the caller starts one now, and it counts as
    /// running until [`Rounds::finish`]. `false`: one runs; another is due after it.
    #[must_use]
    pub(crate) fn ask(&mut self) -> bool {
        if self.running {
            self.again = true;
            return false;
        }
        self.running = true;
        self.again = false;
        true
    }

    /// As [`Rounds::ask`], but a request while a round runs is dropped, not kept: for a
    /// round whose caller asks again on its own schedule, with fresher inputs than a replay
    /// right after the running round would have.
    #[must_use]
    pub(crate) fn try_start(&mut self) -> bool {
        if self.running {
            return false;
        }
        self.running = true;
        self.again = false;
        true
    }

    /// Another round is due after the running one: it changed what its own decision read.
    pub(crate) fn ask_again(&mut self) {
        self.again = true;
    }

    /// The running round ended. `true`: another was asked meanwhile, and the caller asks for
    /// it now.
    #[must_use]
    pub(crate) fn finish(&mut self) -> bool {
        debug_assert!(self.running, "a round finished that never started");
        self.running = false;
        std::mem::take(&mut self.again)
    }
}

#[cfg(test)]
mod tests {
    use super::Rounds;

    #[test]
    fn a_round_starts_when_none_runs() {
        let mut rounds = Rounds::default();
        assert!(rounds.try_start(), "none runs at first");
        assert!(!rounds.finish(), "nobody asked for another");
        assert!(rounds.ask(), "the next one starts at once");
        assert!(!rounds.try_start(), "it runs");
        assert!(!rounds.finish());
        assert!(rounds.ask(), "and runs no more");
    }

    #[test]
    fn asks_while_one_runs_make_exactly_one_more() {
        let mut rounds = Rounds::default();
        assert!(rounds.ask());
        assert!(
            !rounds.ask(),
            "a second round never starts beside the first"
        );
        assert!(!rounds.ask());
        assert!(rounds.finish(), "the asks made meanwhile are not lost");
        assert!(rounds.ask());
        assert!(!rounds.finish(), "and they made one round, not one each");
    }

    #[test]
    fn a_round_may_ask_for_the_next_itself() {
        let mut rounds = Rounds::default();
        assert!(rounds.ask());
        rounds.ask_again();
        assert!(rounds.finish());
    }

    #[test]
    fn an_ask_before_a_round_starts_is_not_carried_into_it() {
        let mut rounds = Rounds::default();
        assert!(rounds.ask());
        rounds.ask_again();
        assert!(rounds.finish());
        // The round asked for now reads everything afresh: it owes no other after it.
        assert!(rounds.ask());
        assert!(!rounds.finish());
    }

    #[test]
    fn try_start_drops_what_comes_while_one_runs() {
        let mut rounds = Rounds::default();
        assert!(rounds.try_start());
        assert!(!rounds.try_start());
        assert!(!rounds.finish(), "a dropped request leaves no round due");
        assert!(rounds.try_start());
    }
}
