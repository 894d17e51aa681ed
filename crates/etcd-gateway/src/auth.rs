//! etcd's authentication: a token from `POST /v3/auth/authenticate`, kept for the calls of a
//! client and its clones, and forgotten when etcd refuses it.
//!
//! etcd (3.4 and later) with `auth enable` takes a call only with a token in its
//! `Authorization` header. etcd's default "simple" tokens live in each member's memory and die
//! `--auth-token-ttl` (300 s by default) after their last use (a restart of etcd 3.4 keeps
//! them: it replays the authentications in its log, measured); JWT tokens die at a fixed
//! time. Either way the refusal is the same: "invalid auth token", or "revision
//! of auth store is old" when users or roles changed since the token was made. etcd checks the
//! token before the request goes to raft, so a refused request was not applied, and sending it
//! again with a new token is safe. A wrong password is not a token problem: it is
//! [`Error::AuthFailed`], for the caller to stop on.

use std::sync::{Arc, Mutex};

use serde::Deserialize;
use serde_json::{json, Value};

use crate::error::{Error, Result};

/// A user's credentials and the token they last got.
pub(crate) struct Auth {
    user: String,
    password: String,
    token: Mutex<Option<Token>>,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

/// What goes in a call's `Authorization` header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Token {
    Value(Arc<str>),
    /// etcd said authentication is not enabled: calls carry no token.
    NotNeeded,
}

impl Token {
    pub(crate) fn header(&self) -> Option<&str> {
        match self {
            Token::Value(token) => Some(token),
            Token::NotNeeded => None,
        }
    }
}

#[derive(Deserialize)]
struct AuthenticateResponse {
    #[serde(default)]
    token: String,
}

impl Auth {
    pub(crate) fn new(user: String, password: String) -> Auth {
        Auth {
            user,
            password,
            token: Mutex::new(None),
        }
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<Token>> {
        // The lock guards one assignment; a panic cannot leave it half done.
        self.token
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The token to send, if one is known.
    pub(crate) fn token(&self) -> Option<Token> {
        self.slot().clone()
    }

    /// Forgets `token` after etcd refused it (unless another call has already replaced it).
    pub(crate) fn forget(&self, token: &Token) {
        let mut slot = self.slot();
        if slot.as_ref() == Some(token) {
            *slot = None;
        }
    }

    pub(crate) fn request(&self) -> Value {
        json!({ "name": self.user, "password": self.password })
    }

    /// The token in an answer of `/v3/auth/authenticate`, kept for the next calls.
    pub(crate) fn accept(&self, answer: &[u8]) -> Result<Token> {
        let answer: AuthenticateResponse = serde_json::from_slice(answer)
            .map_err(|e| Error::malformed("/v3/auth/authenticate", e.to_string()))?;
        if answer.token.is_empty() {
            return Err(Error::malformed(
                "/v3/auth/authenticate",
                "the answer has no token",
            ));
        }
        let token = Token::Value(answer.token.into());
        *self.slot() = Some(token.clone());
        Ok(token)
    }

    /// What a failed `/v3/auth/authenticate` means: a refused password, no authentication
    /// to do (etcd's auth is off, so calls go without a token), or the error as it came.
    pub(crate) fn refused(&self, e: Error) -> Result<Token> {
        match e {
            Error::Status { message, .. } if message.contains("authentication is not enabled") => {
                *self.slot() = Some(Token::NotNeeded);
                Ok(Token::NotNeeded)
            }
            Error::Status { message, .. }
                if message.contains("authentication failed")
                    || message.contains("invalid user ID or password") =>
            {
                Err(Error::AuthFailed {
                    user: self.user.clone(),
                    message,
                })
            }
            other => Err(other),
        }
    }
}

/// Whether etcd refused a call for its token (expired, unknown to the member, or older than
/// a change of users or roles), rather than for what it asked.
pub(crate) fn refused_token(e: &Error) -> bool {
    // A watch's creation is refused by a cancellation that carries the same text.
    let (Error::Status { message, .. } | Error::WatchCanceled { reason: message }) = e else {
        return false;
    };
    matches!(message, message
        if message.contains("invalid auth token")
            || message.contains("revision of auth store is old")
            // A call without a token, made while etcd's authentication was off, after it
            // was turned on.
            || message.contains("user name is empty"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: i64, message: &str) -> Error {
        Error::Status {
            path: "/v3/kv/put",
            status: 401,
            code,
            message: message.into(),
        }
    }

    #[test]
    fn token_refusals_are_told_from_other_errors() {
        assert!(refused_token(&status(16, "etcdserver: invalid auth token")));
        assert!(refused_token(&status(
            3,
            "etcdserver: revision of auth store is old"
        )));
        assert!(!refused_token(&status(7, "etcdserver: permission denied")));
        assert!(!refused_token(&Error::WatchEnded));
        assert!(refused_token(&Error::WatchCanceled {
            reason: "rpc error: code = Unauthenticated desc = etcdserver: invalid auth token"
                .into()
        }));
    }

    #[test]
    fn a_refused_password_is_auth_failed_and_auth_off_needs_no_token() {
        let auth = Auth::new("u".into(), "p".into());
        let e = auth
            .refused(status(
                3,
                "etcdserver: authentication failed, invalid user ID or password",
            ))
            .unwrap_err();
        assert!(
            matches!(&e, Error::AuthFailed { user, .. } if user == "u"),
            "{e}"
        );
        assert!(e.is_refused_credentials());
        assert_eq!(auth.token(), None);
        let token = auth
            .refused(status(9, "etcdserver: authentication is not enabled"))
            .expect("no token needed");
        assert_eq!(token, Token::NotNeeded);
        assert_eq!(auth.token(), Some(Token::NotNeeded));
    }

    #[test]
    fn a_token_is_kept_until_refused_and_a_newer_one_survives_an_old_refusal() {
        let auth = Auth::new("u".into(), "p".into());
        let first = auth
            .accept(br#"{"header":{},"token":"t1"}"#)
            .expect("token");
        assert_eq!(first.header(), Some("t1"));
        assert_eq!(auth.token(), Some(first.clone()));
        let second = auth.accept(br#"{"token":"t2"}"#).expect("token");
        auth.forget(&first);
        assert_eq!(auth.token(), Some(second.clone()));
        auth.forget(&second);
        assert_eq!(auth.token(), None);
        assert!(auth.accept(br#"{"header":{}}"#).is_err());
    }
}
