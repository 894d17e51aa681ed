//! Synchronous replication as PostgreSQL 15 does it (syncrep.c, syncrep_gram.y), as plain
//! functions and data: parse `synchronous_standby_names`, decide each standby's priority and
//! `sync_state`, compute how far the synchronous standbys have written, flushed and applied,
//! and release the appends waiting for that.
//!
//! Grammar:
//! ```text
//! ''                                  no synchronous standbys
//! name [, ...]                        FIRST 1 (name, ...)
//! [FIRST] num (name [, ...])          the num standbys earliest in the list that are streaming
//! ANY num (name [, ...])              any num of the listed standbys (quorum)
//! ```
//! A name is an identifier (compared case-insensitively) or a double-quoted string; `*`
//! matches every standby. Names match a walsender's `application_name`.

use std::collections::HashMap;

use wal_storage::{Lsn, TimelineId};

/// `FIRST` (priority) or `ANY` (quorum).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncMethod {
    First,
    Any,
}

/// A parsed `synchronous_standby_names`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyncStandbyNames {
    pub method: SyncMethod,
    pub num_sync: usize,
    pub names: Vec<String>,
}

/// Parses `synchronous_standby_names`; `Ok(None)` when it names no standby.
pub fn parse_sync_standby_names(text: &str) -> Result<Option<SyncStandbyNames>, String> {
    let tokens = tokenize(text)?;
    if tokens.is_empty() {
        return Ok(None);
    }
    let mut p = Parser {
        tokens,
        at: 0,
        text,
    };
    let cfg = p.parse()?;
    if p.at != p.tokens.len() {
        return Err(p.error("unexpected text after the standby list"));
    }
    Ok(Some(cfg))
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    /// A bare word, down-cased; `quoted` keeps a double-quoted name as written.
    Name {
        text: String,
        quoted: bool,
    },
    Number(usize),
    LParen,
    RParen,
    Comma,
    Star,
}

fn tokenize(text: &str) -> Result<Vec<Token>, String> {
    let mut out = Vec::new();
    let mut chars = text.char_indices().peekable();
    while let Some(&(i, c)) = chars.peek() {
        match c {
            c if c.is_whitespace() => {
                chars.next();
            }
            '(' => {
                chars.next();
                out.push(Token::LParen);
            }
            ')' => {
                chars.next();
                out.push(Token::RParen);
            }
            ',' => {
                chars.next();
                out.push(Token::Comma);
            }
            '*' => {
                chars.next();
                out.push(Token::Star);
            }
            '"' => {
                chars.next();
                let mut s = String::new();
                loop {
                    match chars.next() {
                        Some((_, '"')) => {
                            if chars.peek().map(|&(_, c)| c) == Some('"') {
                                chars.next();
                                s.push('"');
                            } else {
                                break;
                            }
                        }
                        Some((_, c)) => s.push(c),
                        None => {
                            return Err(format!("unterminated quoted name at position {}", i + 1))
                        }
                    }
                }
                out.push(Token::Name {
                    text: s,
                    quoted: true,
                });
            }
            c if c.is_ascii_digit() => {
                let mut s = String::new();
                while let Some(&(_, d)) = chars.peek() {
                    if d.is_ascii_digit() {
                        s.push(d);
                        chars.next();
                    } else {
                        break;
                    }
                }
                // A number followed by letters is a name (PostgreSQL's lexer allows names like
                // "2ndstandby" only quoted, so reject it clearly instead).
                if chars
                    .peek()
                    .is_some_and(|&(_, d)| d.is_alphanumeric() || d == '_')
                {
                    return Err(format!(
                        "invalid name starting with a digit at position {}",
                        i + 1
                    ));
                }
                let n = s
                    .parse()
                    .map_err(|_| format!("number too large at position {}", i + 1))?;
                out.push(Token::Number(n));
            }
            c if c.is_alphanumeric() || c == '_' || c == '$' => {
                let mut s = String::new();
                while let Some(&(_, d)) = chars.peek() {
                    if d.is_alphanumeric() || d == '_' || d == '$' || d == '-' || d == '.' {
                        s.push(d);
                        chars.next();
                    } else {
                        break;
                    }
                }
                out.push(Token::Name {
                    text: s.to_lowercase(),
                    quoted: false,
                });
            }
            other => return Err(format!("syntax error at {other:?} (position {})", i + 1)),
        }
    }
    Ok(out)
}

struct Parser<'a> {
    tokens: Vec<Token>,
    at: usize,
    text: &'a str,
}

impl Parser<'_> {
    fn error(&self, what: &str) -> String {
        format!("invalid synchronous_standby_names {:?}: {what}", self.text)
    }

    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.at)
    }

    fn next(&mut self) -> Option<Token> {
        let t = self.tokens.get(self.at).cloned();
        self.at += 1;
        t
    }

    fn parse(&mut self) -> Result<SyncStandbyNames, String> {
        // FIRST n (...) / ANY n (...): the keyword must be followed by a number.
        if let (
            Some(Token::Name {
                text,
                quoted: false,
            }),
            Some(Token::Number(_)),
        ) = (self.tokens.first().cloned(), self.tokens.get(1))
        {
            let method = match text.as_str() {
                "first" => SyncMethod::First,
                "any" => SyncMethod::Any,
                _ => return Err(self.error("expected FIRST or ANY before the number")),
            };
            self.at = 1;
            return self.counted(method);
        }
        if let Some(Token::Number(_)) = self.peek() {
            return self.counted(SyncMethod::First);
        }
        // A bare list: FIRST 1.
        let names = self.list()?;
        Ok(SyncStandbyNames {
            method: SyncMethod::First,
            num_sync: 1,
            names,
        })
    }

    fn counted(&mut self, method: SyncMethod) -> Result<SyncStandbyNames, String> {
        let Some(Token::Number(n)) = self.next() else {
            return Err(self.error("expected the number of synchronous standbys"));
        };
        if n == 0 {
            return Err(self.error("the number of synchronous standbys must be greater than zero"));
        }
        if self.next() != Some(Token::LParen) {
            return Err(self.error("expected ( after the number"));
        }
        let names = self.list()?;
        if self.next() != Some(Token::RParen) {
            return Err(self.error("expected ) after the standby list"));
        }
        Ok(SyncStandbyNames {
            method,
            num_sync: n,
            names,
        })
    }

    fn list(&mut self) -> Result<Vec<String>, String> {
        let mut names = Vec::new();
        loop {
            match self.next() {
                Some(Token::Name { text, .. }) => names.push(text),
                Some(Token::Star) => names.push("*".to_string()),
                _ => return Err(self.error("expected a standby name")),
            }
            match self.peek() {
                Some(Token::Comma) => {
                    self.at += 1;
                }
                _ => return Ok(names),
            }
        }
    }
}

impl SyncStandbyNames {
    /// A standby's priority: its 1-based place in the list (FIRST), 1 for any match (ANY),
    /// 0 for none (asynchronous). Names compare case-insensitively, as PostgreSQL's do.
    pub fn priority(&self, application_name: &str) -> u32 {
        let hit = self
            .names
            .iter()
            .position(|n| n == "*" || n.eq_ignore_ascii_case(application_name));
        match (hit, self.method) {
            (None, _) => 0,
            (Some(_), SyncMethod::Any) => 1,
            (Some(i), SyncMethod::First) => i as u32 + 1,
        }
    }
}

/// A walsender as synchronous replication sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StandbyPositions {
    pub pid: u32,
    pub application_name: String,
    /// Streaming (caught up at least once) with a valid flush position: a candidate.
    pub streaming: bool,
    pub write: Lsn,
    pub flush: Lsn,
    pub apply: Lsn,
}

/// How far the synchronous standbys, taken together, have come.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyncPositions {
    pub write: Lsn,
    pub flush: Lsn,
    pub apply: Lsn,
}

impl SyncPositions {
    /// Each position no higher than `limit`.
    pub fn at_most(self, limit: Lsn) -> SyncPositions {
        SyncPositions {
            write: self.write.min(limit),
            flush: self.flush.min(limit),
            apply: self.apply.min(limit),
        }
    }
}

/// What the synchronous standbys confirmed together, and the timeline on which it counts:
/// a switch to a new timeline keeps of it only what lies below the switch point
/// ([`crate::overlap::counted_up_to`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Confirmed {
    pub timeline: TimelineId,
    pub positions: SyncPositions,
}

/// The decision for the current set of standbys.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SyncDecision {
    /// Per pid: `sync_priority` and `sync_state` as pg_stat_replication shows them.
    pub states: HashMap<u32, (u32, &'static str)>,
    /// `None` while too few synchronous standbys are streaming: nothing can be released.
    pub positions: Option<SyncPositions>,
}

/// PostgreSQL's SyncRepGetCandidateStandbys, SyncRepGetSyncRecPtr and the `sync_state` column.
pub fn decide(cfg: Option<&SyncStandbyNames>, standbys: &[StandbyPositions]) -> SyncDecision {
    let Some(cfg) = cfg else {
        return SyncDecision {
            states: standbys.iter().map(|s| (s.pid, (0, "async"))).collect(),
            positions: None,
        };
    };
    let mut candidates: Vec<(u32, &StandbyPositions)> = standbys
        .iter()
        .map(|s| (cfg.priority(&s.application_name), s))
        .filter(|(p, s)| *p > 0 && s.streaming && s.flush.is_valid())
        .collect();
    // Lower priority values first; equal priorities in connection order (pids grow).
    // PostgreSQL orders them by WalSnd slot, which is the same order except that a new
    // walsender there takes the lowest free slot, ahead of older connections in later ones.
    candidates.sort_by_key(|(p, s)| (*p, s.pid));
    let chosen: Vec<&StandbyPositions> = match cfg.method {
        SyncMethod::First => candidates
            .iter()
            .take(cfg.num_sync)
            .map(|(_, s)| *s)
            .collect(),
        SyncMethod::Any => candidates.iter().map(|(_, s)| *s).collect(),
    };
    let sync_word = match cfg.method {
        SyncMethod::First => "sync",
        SyncMethod::Any => "quorum",
    };
    let states = standbys
        .iter()
        .map(|s| {
            let p = cfg.priority(&s.application_name);
            let state = if p == 0 {
                "async"
            } else if chosen.iter().any(|c| c.pid == s.pid) {
                sync_word
            } else {
                "potential"
            };
            (s.pid, (p, state))
        })
        .collect();
    let positions = if chosen.len() < cfg.num_sync {
        None
    } else {
        let pick = |f: fn(&StandbyPositions) -> Lsn| -> Lsn {
            let mut v: Vec<Lsn> = chosen.iter().map(|s| f(s)).collect();
            match cfg.method {
                // The oldest position among the chosen ones.
                SyncMethod::First => v.into_iter().min().unwrap_or_default(),
                // The num_sync-th newest: that many standbys have reached it.
                SyncMethod::Any => {
                    v.sort_unstable_by(|a, b| b.cmp(a));
                    v[cfg.num_sync - 1]
                }
            }
        };
        Some(SyncPositions {
            write: pick(|s| s.write),
            flush: pick(|s| s.flush),
            apply: pick(|s| s.apply),
        })
    };
    SyncDecision { states, positions }
}

/// Which standby position an append waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WaitLevel {
    Write,
    Flush,
    Apply,
}

/// Appends waiting for the synchronous standbys, by level, in LSN order.
pub struct Waiters<T> {
    queues: [Vec<(Lsn, T)>; 3],
}

impl<T> Default for Waiters<T> {
    fn default() -> Self {
        Waiters {
            queues: [Vec::new(), Vec::new(), Vec::new()],
        }
    }
}

impl<T> Waiters<T> {
    fn index(level: WaitLevel) -> usize {
        match level {
            WaitLevel::Write => 0,
            WaitLevel::Flush => 1,
            WaitLevel::Apply => 2,
        }
    }

    pub fn push(&mut self, level: WaitLevel, lsn: Lsn, waiter: T) {
        let q = &mut self.queues[Self::index(level)];
        // Appends arrive nearly in LSN order: insert from the back.
        let at = q.iter().rposition(|(l, _)| *l <= lsn).map_or(0, |i| i + 1);
        q.insert(at, (lsn, waiter));
    }

    /// Removes and returns every waiter whose LSN the positions have reached.
    pub fn release(&mut self, p: SyncPositions) -> Vec<T> {
        let mut out = Vec::new();
        for (level, upto) in [
            (WaitLevel::Write, p.write),
            (WaitLevel::Flush, p.flush),
            (WaitLevel::Apply, p.apply),
        ] {
            let q = &mut self.queues[Self::index(level)];
            let n = q.partition_point(|(l, _)| *l <= upto);
            out.extend(q.drain(..n).map(|(_, w)| w));
        }
        out
    }

    /// Removes every waiter (synchronous replication was turned off).
    pub fn release_all(&mut self) -> Vec<T> {
        self.queues
            .iter_mut()
            .flat_map(|q| q.drain(..).map(|(_, w)| w))
            .collect()
    }

    /// Drops waiters `keep` says no longer matter (their append gave up).
    pub fn retain(&mut self, mut keep: impl FnMut(&T) -> bool) {
        for q in &mut self.queues {
            q.retain(|(_, w)| keep(w));
        }
    }

    pub fn len(&self) -> usize {
        self.queues.iter().map(Vec::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> SyncStandbyNames {
        parse_sync_standby_names(s).unwrap().unwrap()
    }

    #[test]
    fn grammar() {
        assert_eq!(parse_sync_standby_names("").unwrap(), None);
        assert_eq!(parse_sync_standby_names("   ").unwrap(), None);
        let c = parse("s1");
        assert_eq!(
            (c.method, c.num_sync, c.names.clone()),
            (SyncMethod::First, 1, vec!["s1".to_string()])
        );
        let c = parse("s1, S2 ,s3");
        assert_eq!(c.names, ["s1", "s2", "s3"]);
        let c = parse("FIRST 2 (s1, s2, s3)");
        assert_eq!((c.method, c.num_sync), (SyncMethod::First, 2));
        let c = parse("any 2 (s1, \"Mixed Case\", *)");
        assert_eq!((c.method, c.num_sync), (SyncMethod::Any, 2));
        assert_eq!(c.names, ["s1", "Mixed Case", "*"]);
        let c = parse("2 (a, b)");
        assert_eq!((c.method, c.num_sync), (SyncMethod::First, 2));
        let c = parse("*");
        assert_eq!(c.names, ["*"]);
        let c = parse("\"we\"\"ird\"");
        assert_eq!(c.names, ["we\"ird"]);
        for bad in [
            "FIRST (a)",
            "ANY 0 (a)",
            "ANY 2 a, b",
            "2 (a, b",
            "a b",
            "(a)",
            "a,",
            "SOME 2 (a)",
            "\"open",
        ] {
            assert!(parse_sync_standby_names(bad).is_err(), "{bad:?} parsed");
        }
    }

    fn sb(pid: u32, name: &str, flush: u64) -> StandbyPositions {
        StandbyPositions {
            pid,
            application_name: name.into(),
            streaming: true,
            write: Lsn(flush + 10),
            flush: Lsn(flush),
            apply: Lsn(flush.saturating_sub(10)),
        }
    }

    // The scenarios of PostgreSQL's src/test/recovery/t/007_sync_rep.pl, as decisions.
    fn states(cfg: &str, standbys: &[StandbyPositions]) -> Vec<(String, u32, &'static str)> {
        let cfg = parse_sync_standby_names(cfg).unwrap();
        let d = decide(cfg.as_ref(), standbys);
        standbys
            .iter()
            .map(|s| {
                let (p, st) = d.states[&s.pid];
                (s.application_name.clone(), p, st)
            })
            .collect()
    }

    fn triple(v: &[(&str, u32, &'static str)]) -> Vec<(String, u32, &'static str)> {
        v.iter().map(|(n, p, s)| (n.to_string(), *p, *s)).collect()
    }

    #[test]
    fn sync_rep_007_scenarios() {
        let s1 = sb(1, "standby1", 100);
        let s2 = sb(2, "standby2", 100);
        let s3 = sb(3, "standby3", 100);
        let s4 = sb(4, "standby4", 100);
        // "standby1,standby2": the first is sync, the second potential.
        assert_eq!(
            states("standby1,standby2", &[s1.clone(), s2.clone()]),
            triple(&[("standby1", 1, "sync"), ("standby2", 2, "potential")])
        );
        // Order of connection does not matter: priority does.
        assert_eq!(
            states("standby1,standby2", &[s2.clone(), s1.clone()]),
            triple(&[("standby2", 2, "potential"), ("standby1", 1, "sync")])
        );
        // The sync standby goes away: the potential one takes over.
        assert_eq!(
            states("standby1,standby2", std::slice::from_ref(&s2)),
            triple(&[("standby2", 2, "sync")])
        );
        // "*": every standby has priority 1, the first connected is sync.
        assert_eq!(
            states("*", &[s1.clone(), s2.clone(), s3.clone()]),
            triple(&[
                ("standby1", 1, "sync"),
                ("standby2", 1, "potential"),
                ("standby3", 1, "potential")
            ])
        );
        // "2(standby1,standby2,standby3)": two syncs by priority; an unlisted one is async.
        assert_eq!(
            states(
                "2(standby1,standby2,standby3)",
                &[s1.clone(), s2.clone(), s3.clone(), s4.clone()]
            ),
            triple(&[
                ("standby1", 1, "sync"),
                ("standby2", 2, "sync"),
                ("standby3", 3, "potential"),
                ("standby4", 0, "async")
            ])
        );
        // A name and "*": standby2 is named first, the others match "*" at priority 2.
        assert_eq!(
            states("2(standby2, *)", &[s1.clone(), s2.clone(), s3.clone()]),
            triple(&[
                ("standby1", 2, "sync"),
                ("standby2", 1, "sync"),
                ("standby3", 2, "potential")
            ])
        );
        // Quorum: every listed standby is "quorum" with priority 1.
        assert_eq!(
            states(
                "ANY 2(standby1, standby2)",
                &[s1.clone(), s2.clone(), s4.clone()]
            ),
            triple(&[
                ("standby1", 1, "quorum"),
                ("standby2", 1, "quorum"),
                ("standby4", 0, "async")
            ])
        );
        assert_eq!(
            states("ANY 2(*)", &[s1.clone(), s2.clone(), s3.clone()]),
            triple(&[
                ("standby1", 1, "quorum"),
                ("standby2", 1, "quorum"),
                ("standby3", 1, "quorum")
            ])
        );
        // A standby still catching up is only potential.
        let mut catching = s1.clone();
        catching.streaming = false;
        assert_eq!(
            states("standby1,standby2", &[catching, s2]),
            triple(&[("standby1", 1, "potential"), ("standby2", 2, "sync")])
        );
    }

    /// The second half of 007_sync_rep.pl, after every standby was stopped and standby2,
    /// standby3, standby1, standby4 reconnected in that order: among equal priorities the
    /// earlier connection (a lower pid here, an earlier WalSnd slot there) wins. Rows are in
    /// application_name order, as the script's query sorts them.
    #[test]
    fn sync_rep_007_after_the_standbys_reconnect() {
        let s2 = sb(10, "standby2", 100);
        let s3 = sb(11, "standby3", 100);
        let s1 = sb(12, "standby1", 100);
        let s4 = sb(13, "standby4", 100);
        let only_2_3 = [s2.clone(), s3.clone()];
        let all = [s1.clone(), s2.clone(), s3.clone(), s4.clone()];
        let without_3 = [s1.clone(), s2.clone(), s4.clone()];
        // "2 synchronous standbys".
        assert_eq!(
            states("2(standby1,standby2,standby3)", &only_2_3),
            triple(&[("standby2", 2, "sync"), ("standby3", 3, "sync")])
        );
        // "2 sync, 1 potential, and 1 async".
        assert_eq!(
            states("2(standby1,standby2,standby3)", &all),
            triple(&[
                ("standby1", 1, "sync"),
                ("standby2", 2, "sync"),
                ("standby3", 3, "potential"),
                ("standby4", 0, "async")
            ])
        );
        // "num_sync exceeds the num of potential sync standbys": every candidate is sync, and
        // a listed name nobody uses (standby0) still takes its place in the priorities.
        let six = "6(standby4,standby0,standby3,standby2)";
        assert_eq!(
            states(six, &all),
            triple(&[
                ("standby1", 0, "async"),
                ("standby2", 4, "sync"),
                ("standby3", 3, "sync"),
                ("standby4", 1, "sync")
            ])
        );
        // With fewer than six synchronous standbys streaming nothing is released, as
        // PostgreSQL's SyncRepGetSyncRecPtr gives no position then.
        let cfg = parse(six);
        assert_eq!(decide(Some(&cfg), &all).positions, None);
        // "asterisk comes before another standby name": standby2 matches "*" first, so its
        // priority is 2, and it wins over standby3 and standby4 by connecting earlier.
        assert_eq!(
            states("2(standby1,*,standby2)", &all),
            triple(&[
                ("standby1", 1, "sync"),
                ("standby2", 2, "sync"),
                ("standby3", 2, "potential"),
                ("standby4", 2, "potential")
            ])
        );
        // "multiple standbys having the same priority are chosen as sync": the two earliest
        // connections.
        assert_eq!(
            states("2(*)", &all),
            triple(&[
                ("standby1", 1, "potential"),
                ("standby2", 1, "sync"),
                ("standby3", 1, "sync"),
                ("standby4", 1, "potential")
            ])
        );
        // "potential standby found earlier in array is promoted to sync": standby3 stops, and
        // standby1, connected before standby4, takes its place.
        assert_eq!(
            states("2(*)", &without_3),
            triple(&[
                ("standby1", 1, "sync"),
                ("standby2", 1, "sync"),
                ("standby4", 1, "potential")
            ])
        );
        // "priority-based sync replication specified by FIRST keyword".
        assert_eq!(
            states("FIRST 2(standby1, standby2)", &without_3),
            triple(&[
                ("standby1", 1, "sync"),
                ("standby2", 2, "sync"),
                ("standby4", 0, "async")
            ])
        );
        // "2 quorum and 1 async".
        assert_eq!(
            states("ANY 2(standby1, standby2)", &without_3),
            triple(&[
                ("standby1", 1, "quorum"),
                ("standby2", 1, "quorum"),
                ("standby4", 0, "async")
            ])
        );
        // standby3 comes back (a new connection, so the last one): "all standbys are
        // considered as candidates for quorum sync standbys".
        let s3_again = sb(14, "standby3", 100);
        assert_eq!(
            states("ANY 2(*)", &[s1, s2, s3_again, s4]),
            triple(&[
                ("standby1", 1, "quorum"),
                ("standby2", 1, "quorum"),
                ("standby3", 1, "quorum"),
                ("standby4", 1, "quorum")
            ])
        );
    }

    #[test]
    fn positions_first_take_the_oldest_of_the_chosen() {
        let cfg = parse("2 (a, b, c)");
        let d = decide(
            Some(&cfg),
            &[sb(1, "a", 100), sb(2, "b", 50), sb(3, "c", 10)],
        );
        assert_eq!(d.positions.unwrap().flush, Lsn(50));
        // Too few streaming: nothing can be released.
        let d = decide(Some(&cfg), &[sb(1, "a", 100), sb(3, "x", 10)]);
        assert_eq!(d.positions, None);
    }

    #[test]
    fn positions_any_take_the_nth_newest() {
        let cfg = parse("ANY 2 (a, b, c)");
        let d = decide(
            Some(&cfg),
            &[sb(1, "a", 100), sb(2, "b", 50), sb(3, "c", 70)],
        );
        let p = d.positions.unwrap();
        assert_eq!(p.flush, Lsn(70));
        assert_eq!(p.write, Lsn(80));
        assert_eq!(p.apply, Lsn(60));
    }

    #[test]
    fn waiters_release_in_lsn_order_by_level() {
        let mut w = Waiters::default();
        w.push(WaitLevel::Flush, Lsn(30), "f30");
        w.push(WaitLevel::Flush, Lsn(10), "f10");
        w.push(WaitLevel::Write, Lsn(20), "w20");
        w.push(WaitLevel::Apply, Lsn(5), "a5");
        let got = w.release(SyncPositions {
            write: Lsn(25),
            flush: Lsn(15),
            apply: Lsn(0),
        });
        assert_eq!(got, ["w20", "f10"]);
        assert_eq!(w.len(), 2);
        assert_eq!(w.release_all().len(), 2);
        assert!(w.is_empty());
    }
}
