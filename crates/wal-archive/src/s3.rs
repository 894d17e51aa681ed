//! `s3://bucket/prefix`: an archive on an S3-compatible object store, through the
//! `object_store` crate (its request signing, retries and error mapping).
//!
//! Objects are created with `If-None-Match: *` (`PutMode::Create`), so a name that exists is
//! never replaced, not even by a retried request whose first attempt was stored: the store
//! answers 412 and the caller reads what is there. AWS S3 and SeaweedFS (4.48, the tests'
//! store) honour the header; a store that ignored it would overwrite only in a race, because
//! the caller reads a name before it creates it. A put counts once the store acknowledged
//! it: the store's durability is the archive's.
//!
//! A segment goes as one PUT, not a multipart upload: the create-only condition belongs to
//! a single request (object_store completes multipart uploads without it), and a 16 MiB body
//! is well within one request's limits.
//!
//! The calls are async; they run on a current-thread tokio runtime on a thread of this
//! target's own, started at its first use and ended when the last handle goes, and the
//! blocking methods here wait for them. So the archiver's blocking job stays one job (read,
//! compress, put, store the position), and no actor thread ever waits on the network.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::TryStreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path as ObjectPath;
use object_store::{
    BackoffConfig, ClientOptions, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload,
    RetryConfig,
};
use tokio::sync::oneshot;

use crate::error::{ArchiveError, Result};

/// A guess: a store that does not accept a connection within this is down, and the
/// archiver's own backoff handles down.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// A guess sized for a 16 MiB segment over a slow link (about 150 KiB/s).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
/// object_store's own retries cover a dropped connection or a 5xx in passing; anything
/// longer is the archiver's backoff, which shows each failure in `/status`. Guesses.
const RETRIES: usize = 3;
const RETRY_TIMEOUT: Duration = Duration::from_secs(30);

/// The `[archive]` settings of an S3 target.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct S3Options {
    /// The service's URL (`http://127.0.0.1:8333`); AWS's own endpoint for the region when
    /// unset.
    pub endpoint: Option<String>,
    /// The region requests are signed for; `us-east-1` when unset (S3-compatible stores
    /// mostly ignore it).
    pub region: Option<String>,
    /// Whether an `http://` endpoint is allowed; off, so that credentials and WAL do not
    /// cross a network in clear text by mistake.
    pub allow_http: bool,
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    /// A temporary credential's session token (`AWS_SESSION_TOKEN`).
    pub session_token: Option<String>,
}

impl fmt::Debug for S3Options {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The secret and the token never reach a log line.
        f.debug_struct("S3Options")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("allow_http", &self.allow_http)
            .field("access_key_id", &self.access_key_id)
            .finish_non_exhaustive()
    }
}

/// An S3 bucket and key prefix, with the client made at its first use.
#[derive(Clone)]
pub struct S3Target {
    bucket: String,
    /// Empty, or `a/b` without a leading or trailing slash.
    prefix: String,
    options: S3Options,
    client: Arc<Mutex<Option<Arc<Client>>>>,
}

impl PartialEq for S3Target {
    fn eq(&self, other: &S3Target) -> bool {
        (&self.bucket, &self.prefix, &self.options)
            == (&other.bucket, &other.prefix, &other.options)
    }
}

impl Eq for S3Target {}

impl fmt::Debug for S3Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Target")
            .field("bucket", &self.bucket)
            .field("prefix", &self.prefix)
            .field("options", &self.options)
            .finish()
    }
}

/// A made client and the thread its calls run on.
struct Client {
    store: AmazonS3,
    runtime: tokio::runtime::Handle,
    /// Dropping it ends the runtime's thread.
    _stop: oneshot::Sender<()>,
}

impl S3Target {
    /// The target of `s3://` + `rest` (`bucket` or `bucket/prefix`), checked without I/O.
    pub(crate) fn parse(rest: &str, options: &S3Options) -> std::result::Result<S3Target, String> {
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err("an s3:// target needs a bucket (s3://bucket/prefix)".into());
        }
        let prefix = prefix.trim_matches('/');
        if !prefix.is_empty() {
            ObjectPath::parse(prefix).map_err(|e| format!("the key prefix {prefix:?}: {e}"))?;
        }
        match options.endpoint.as_deref() {
            Some(e) if e.starts_with("http://") && !options.allow_http => {
                return Err(format!(
                "[archive] endpoint {e} is plain http; set [archive] allow_http = true to allow it"
            ))
            }
            Some(e) if !e.starts_with("http://") && !e.starts_with("https://") => {
                return Err(format!(
                    "[archive] endpoint {e:?} must be an http:// or https:// URL"
                ))
            }
            _ => {}
        }
        // Without credentials object_store would ask the cloud's instance metadata service,
        // an address outside anything this node was configured to talk to.
        if options.access_key_id.is_none() || options.secret_access_key.is_none() {
            return Err("an s3:// target needs credentials: AWS_ACCESS_KEY_ID and \
                        AWS_SECRET_ACCESS_KEY in the environment, or access_key_id and \
                        secret_access_key in [archive]"
                .into());
        }
        Ok(S3Target {
            bucket: bucket.to_string(),
            prefix: prefix.to_string(),
            options: options.clone(),
            client: Arc::default(),
        })
    }

    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// `s3://bucket/prefix/name`, as messages name an object.
    pub fn url_of(&self, name: &str) -> String {
        format!("s3://{}/{}", self.bucket, self.key(name))
    }

    fn key(&self, name: &str) -> String {
        if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}/{name}", self.prefix)
        }
    }

    /// The object `name`'s bytes, `None` if there is none. Blocking.
    pub fn read(&self, name: &str) -> Result<Option<Bytes>> {
        let key = ObjectPath::from(self.key(name));
        let url = self.url_of(name);
        self.call(move |store| async move {
            match store.get(&key).await {
                Ok(got) => got.bytes().await.map(Some),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        })?
        .map_err(|e| store_error(format!("reading {url}"), e))
    }

    /// Creates the object `name` holding `bytes` unless one exists: `true` if it was
    /// created, `false` if the name was taken (the caller judges what is there). Blocking.
    pub fn create(&self, name: &str, bytes: Vec<u8>) -> Result<bool> {
        let key = ObjectPath::from(self.key(name));
        let url = self.url_of(name);
        self.call(move |store| async move {
            let opts = PutOptions {
                mode: PutMode::Create,
                ..PutOptions::default()
            };
            match store.put_opts(&key, PutPayload::from(bytes), opts).await {
                Ok(_) => Ok(true),
                Err(object_store::Error::AlreadyExists { .. }) => Ok(false),
                Err(e) => Err(e),
            }
        })?
        .map_err(|e| store_error(format!("putting {url}"), e))
    }

    /// Whether the object `name` exists (a HEAD request). Blocking.
    pub fn exists(&self, name: &str) -> Result<bool> {
        let key = ObjectPath::from(self.key(name));
        let url = self.url_of(name);
        self.call(move |store| async move {
            match store.head(&key).await {
                Ok(_) => Ok(true),
                Err(object_store::Error::NotFound { .. }) => Ok(false),
                Err(e) => Err(e),
            }
        })?
        .map_err(|e| store_error(format!("looking up {url}"), e))
    }

    /// Removes the object `name`; an absent one is not an error. Blocking.
    pub fn delete(&self, name: &str) -> Result<()> {
        let key = ObjectPath::from(self.key(name));
        let url = self.url_of(name);
        self.call(move |store| async move {
            match store.delete(&key).await {
                Err(object_store::Error::NotFound { .. }) => Ok(()),
                r => r,
            }
        })?
        .map_err(|e| store_error(format!("removing {url}"), e))
    }

    /// The names (below the prefix) and sizes of every object under the prefix. Blocking.
    pub fn list(&self) -> Result<Vec<(String, u64)>> {
        let prefix = (!self.prefix.is_empty()).then(|| ObjectPath::from(self.prefix.as_str()));
        let strip = if self.prefix.is_empty() {
            String::new()
        } else {
            format!("{}/", self.prefix)
        };
        let url = self.url_of("");
        let metas =
            self.call(move |store| async move {
                store.list(prefix.as_ref()).try_collect::<Vec<_>>().await
            })?
            .map_err(|e| store_error(format!("listing {url}"), e))?;
        Ok(metas
            .into_iter()
            .filter_map(|m| {
                let key = m.location.to_string();
                key.strip_prefix(&strip).map(|n| (n.to_string(), m.size))
            })
            .collect())
    }

    /// Runs `call` on the target's runtime and waits for its end.
    fn call<T, F, Fut>(&self, call: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(AmazonS3) -> Fut,
        Fut: Future<Output = T> + Send + 'static,
    {
        let client = self.client()?;
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let fut = call(client.store.clone());
        client.runtime.spawn(async move {
            let _ = tx.send(fut.await);
        });
        rx.recv().map_err(|_| {
            ArchiveError::io(
                format!("calling s3://{}", self.bucket),
                std::io::Error::other("the object store's runtime stopped"),
            )
        })
    }

    fn client(&self) -> Result<Arc<Client>> {
        let mut slot = self.client.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let client = Arc::new(self.make_client()?);
        *slot = Some(client.clone());
        Ok(client)
    }

    fn make_client(&self) -> Result<Client> {
        let o = &self.options;
        let mut b = AmazonS3Builder::new()
            .with_bucket_name(&self.bucket)
            .with_region(o.region.as_deref().unwrap_or("us-east-1"))
            .with_allow_http(o.allow_http)
            .with_client_options(
                ClientOptions::new()
                    .with_allow_http(o.allow_http)
                    .with_connect_timeout(CONNECT_TIMEOUT)
                    .with_timeout(REQUEST_TIMEOUT),
            )
            .with_retry(RetryConfig {
                backoff: BackoffConfig::default(),
                max_retries: RETRIES,
                retry_timeout: RETRY_TIMEOUT,
            });
        if let Some(endpoint) = &o.endpoint {
            b = b.with_endpoint(endpoint);
        }
        if let (Some(id), Some(secret)) = (&o.access_key_id, &o.secret_access_key) {
            b = b.with_access_key_id(id).with_secret_access_key(secret);
        }
        if let Some(token) = &o.session_token {
            b = b.with_token(token);
        }
        let store = b
            .build()
            .map_err(|e| store_error(format!("configuring s3://{}", self.bucket), e))?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| ArchiveError::io("starting the object store's runtime", e))?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("archive-s3".into())
            .spawn(move || {
                // Runs the calls until the last handle is dropped; the runtime is dropped
                // here, on its own thread, never inside an async context.
                runtime.block_on(async move {
                    let _ = stopped.await;
                });
            })
            .map_err(|e| ArchiveError::io("starting the object store's thread", e))?;
        Ok(Client {
            store,
            runtime: handle,
            _stop: stop,
        })
    }
}

fn store_error(context: String, source: object_store::Error) -> ArchiveError {
    ArchiveError::Store {
        context,
        source: Box::new(source),
    }
}
