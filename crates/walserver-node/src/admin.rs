//! The client of a node's HTTP admin API (blocking, ureq): what `walserver status`, `promote`
//! and `append` send, and what the load tool reads and posts. `http` is `HOST:PORT` or a full
//! `http://` URL; a bearer token, when given, goes in `Authorization`.

use serde::de::DeserializeOwned;
use serde_json::Value;
use supervisor_actor::NodeStatus;
use ureq::typestate::{WithBody, WithoutBody};
use ureq::RequestBuilder;

use crate::error::{Error, Result};

/// `http` is `HOST:PORT` or a full `http://` URL.
pub fn base_url(http: &str) -> String {
    if http.starts_with("http://") || http.starts_with("https://") {
        http.trim_end_matches('/').to_string()
    } else {
        format!("http://{http}")
    }
}

fn authorized<B>(req: RequestBuilder<B>, token: Option<&str>) -> RequestBuilder<B> {
    match token {
        Some(t) => req.header("Authorization", &format!("Bearer {t}")),
        None => req,
    }
}

/// `GET path` as text; an answer that is not a success is an error, with the API's `error`
/// as its message.
pub fn get_text(http: &str, path: &str, token: Option<&str>) -> Result<String> {
    let url = format!("{}{path}", base_url(http));
    let req = authorized(ureq::get(&url), token)
        .config()
        .http_status_as_error(false)
        .build();
    let mut resp = req.call().map_err(|e| unreachable(&url, e))?;
    let status = resp.status();
    let text = resp
        .body_mut()
        .read_to_string()
        .map_err(|e| unreadable(&url, e))?;
    if !status.is_success() {
        return Err(refused(url, status.as_u16(), &text));
    }
    Ok(text)
}

/// An answer that is not a success: its `error` when it is the API's JSON error, else its
/// text, else its status.
fn refused(url: String, status: u16, text: &str) -> Error {
    let message = serde_json::from_str::<Value>(text)
        .ok()
        .and_then(|v| v["error"].as_str().map(str::to_string))
        .or_else(|| (!text.trim().is_empty()).then(|| text.trim().to_string()))
        .unwrap_or_else(|| format!("HTTP status {status}"));
    Error::AdminRefused {
        url,
        status,
        message,
    }
}

/// `GET path` as JSON; an answer that is not a success is an error.
pub fn get_json(http: &str, path: &str, token: Option<&str>) -> Result<Value> {
    let text = get_text(http, path, token)?;
    parse_answer(&format!("{}{path}", base_url(http)), &text)
}

/// `GET /status`, read into the type the server writes it from.
pub fn get_status(http: &str, token: Option<&str>) -> Result<NodeStatus> {
    let text = get_text(http, "/status", token)?;
    parse_answer(&format!("{}/status", base_url(http)), &text)
}

/// `POST path` with `body`; the JSON answer, or the API's `error` as the error.
pub fn post_json(
    http: &str,
    path: &str,
    token: Option<&str>,
    content_type: &str,
    body: &[u8],
) -> Result<Value> {
    let url = format!("{}{path}", base_url(http));
    let req = authorized(ureq::post(&url).header("Content-Type", content_type), token);
    let config = req.config().http_status_as_error(false).build();
    let mut resp = config.send(body).map_err(|e| unreachable(&url, e))?;
    let status = resp.status();
    let text = resp
        .body_mut()
        .read_to_string()
        .map_err(|e| unreadable(&url, e))?;
    if !status.is_success() {
        return Err(refused(url, status.as_u16(), &text));
    }
    parse_answer(&url, &text)
}

fn unreachable(url: &str, e: ureq::Error) -> Error {
    Error::AdminUnreachable {
        url: url.to_string(),
        source: Box::new(e),
    }
}

fn unreadable(url: &str, e: ureq::Error) -> Error {
    Error::AdminAnswerUnreadable {
        url: url.to_string(),
        source: Box::new(e),
    }
}

/// The answer from `url` as JSON, read into `T`.
fn parse_answer<T: DeserializeOwned>(url: &str, text: &str) -> Result<T> {
    serde_json::from_str(text).map_err(|source| Error::AdminAnswerNotJson {
        url: url.to_string(),
        text: text.to_string(),
        source,
    })
}

/// A client of one node's admin API that keeps its connection between requests (the load
/// tool's writers and fill post many bodies). Every answer comes back as an answer, whatever
/// its status: the caller reads the status.
pub struct AdminClient {
    agent: ureq::Agent,
    base: String,
    token: Option<String>,
}

impl AdminClient {
    pub fn new(http: &str, token: Option<&str>) -> AdminClient {
        AdminClient::with_timeout(http, token, None)
    }

    /// A client whose every request gives up after `timeout` (connecting, sending and
    /// reading the answer together), so that a paused or cut-off node cannot hold a caller
    /// for ever.
    pub fn with_timeout(
        http: &str,
        token: Option<&str>,
        timeout: Option<std::time::Duration>,
    ) -> AdminClient {
        AdminClient {
            agent: ureq::Agent::config_builder()
                .http_status_as_error(false)
                .timeout_global(timeout)
                .build()
                .into(),
            base: base_url(http),
            token: token.map(str::to_string),
        }
    }

    /// `GET path`, ready to call.
    pub fn get(&self, path: &str) -> RequestBuilder<WithoutBody> {
        authorized(
            self.agent.get(format!("{}{path}", self.base)),
            self.token.as_deref(),
        )
    }

    /// `POST path` of a `content_type` body, ready to send.
    pub fn post(&self, path: &str, content_type: &str) -> RequestBuilder<WithBody> {
        authorized(
            self.agent
                .post(format!("{}{path}", self.base))
                .header("Content-Type", content_type),
            self.token.as_deref(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_become_urls() {
        assert_eq!(base_url("127.0.0.1:8433"), "http://127.0.0.1:8433");
        assert_eq!(base_url("http://h:1/"), "http://h:1");
        assert_eq!(base_url("https://h:1"), "https://h:1");
    }
}
