//! Why authentication failed, on either side, and what the client is told.

use crate::messages::{ErrorFields, SqlState};

/// Why authentication failed. Kept apart from [`crate::CodecError`] because the two are
/// reported differently: a failed password is FATAL 28P01 with a message that must not say
/// why (the reason goes to the server log), while codec errors are protocol violations.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// The password or proof did not match (28P01). `reason` is for the server's log only;
    /// the client is told just the message.
    #[error("password authentication failed for user \"{user}\"")]
    PasswordFailed { user: String, reason: String },
    /// No such role (28000). Only for methods without a password exchange; password methods
    /// report [`AuthError::PasswordFailed`] so they do not reveal which roles exist.
    #[error("role \"{user}\" does not exist")]
    UnknownRole { user: String },
    /// The client's SASL message breaks the protocol (08P01: "malformed SCRAM message",
    /// mostly) or its channel binding does not hold (28000): PostgreSQL's SQLSTATE, text and,
    /// where it gives one, detail.
    #[error("{message}{}", detail.as_ref().map(|d| format!(": {d}")).unwrap_or_default())]
    Scram {
        code: SqlState,
        message: String,
        detail: Option<String>,
    },
    /// A PasswordMessage that is not one string filling the message (08P01).
    #[error("invalid password packet size")]
    InvalidPasswordPacket,
    /// An empty password, refused before it is checked, as PostgreSQL refuses it (28P01).
    #[error("empty password returned by client")]
    EmptyPassword,
    /// The client picked a mechanism we did not offer (08P01).
    #[error("client selected an invalid SASL authentication mechanism")]
    InvalidMechanism,
    /// A stored secret is not a valid SCRAM verifier (a server configuration error).
    #[error("invalid SCRAM secret: {detail}")]
    InvalidVerifier { detail: String },
    /// Client side: the server asked for something we cannot do.
    #[error("{0}")]
    Unsupported(String),
    /// Client side, `channel_binding=require`: the server did not authenticate with a bound
    /// SCRAM exchange (libpq's texts).
    #[error("{0}")]
    ChannelBindingRequired(&'static str),
    /// Client side: the server asked for a password and none was configured.
    #[error("the server requested password-based authentication, but no password was provided")]
    NoPassword,
    /// Client side: the server's SCRAM messages were invalid or its signature did not verify,
    /// so the server may not be who it claims.
    #[error("SCRAM authentication with the server failed: {0}")]
    ServerScram(String),
    /// A message in the exchange could not be decoded.
    #[error(transparent)]
    Codec(#[from] crate::CodecError),
}

impl AuthError {
    pub fn sqlstate(&self) -> SqlState {
        match self {
            AuthError::PasswordFailed { .. } => SqlState::INVALID_PASSWORD,
            AuthError::UnknownRole { .. } => SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
            AuthError::EmptyPassword => SqlState::INVALID_PASSWORD,
            AuthError::Scram { code, .. } => *code,
            AuthError::InvalidPasswordPacket
            | AuthError::InvalidMechanism
            | AuthError::Codec(_) => SqlState::PROTOCOL_VIOLATION,
            AuthError::InvalidVerifier { .. } | AuthError::ServerScram(_) => {
                SqlState::INTERNAL_ERROR
            }
            AuthError::Unsupported(_) => SqlState::FEATURE_NOT_SUPPORTED,
            AuthError::ChannelBindingRequired(_) => SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
            AuthError::NoPassword => SqlState::INVALID_PASSWORD,
        }
    }

    /// The FATAL a server sends before closing the connection. A verifier problem is reported
    /// to the client as a failed password, as PostgreSQL does.
    pub fn to_error_fields(&self, user: &str) -> ErrorFields {
        match self {
            AuthError::InvalidVerifier { .. } | AuthError::PasswordFailed { .. } => {
                ErrorFields::fatal(
                    SqlState::INVALID_PASSWORD,
                    format!("password authentication failed for user \"{user}\""),
                )
            }
            AuthError::Scram {
                code,
                message,
                detail,
            } => {
                let fields = ErrorFields::fatal(*code, message.clone());
                match detail {
                    Some(d) => fields.detail(d.clone()),
                    None => fields,
                }
            }
            other => ErrorFields::fatal(other.sqlstate(), other.to_string()),
        }
    }
}

/// A wrong password (or proof): the client hears only that it failed, `reason` goes to the
/// server's log.
pub(super) fn failed(user: &str, reason: impl Into<String>) -> AuthError {
    AuthError::PasswordFailed {
        user: user.to_string(),
        reason: reason.into(),
    }
}
