//! `s3://bucket/prefix`: an archive on an S3-compatible object store, through the
//! `object_store` crate (its request signing, retries and error mapping).
//!
//! Objects are created with `If-None-Match: *` (`PutMode::Create`), so a name that exists is
//! never replaced, not even by a retried request whose first attempt was stored: the store
//! answers 412 and the caller reads what is there. AWS S3 and SeaweedFS (4.48, the tests'
//! store) honour the header, and the archive needs a store that does: the caller creates
//! without reading first (a failed create is how it learns a name exists), so a store that
//! ignored the header would let a retry or a second writer replace an object. A put counts
//! once the store acknowledged it: the store's durability is the archive's.
//!
//! An object larger than one part (`[archive] multipart_part_size`, 8 MiB by default) goes
//! as a multipart upload: its parts travel [`PARALLEL_PARTS`] at a time and each is retried
//! by itself, and S3 makes the object visible only when the upload is completed, so an
//! upload that fails or is killed half-way never shows a partial object. A failed one is
//! aborted at once; one abandoned by a kill -9 stays invisible (as S3 keeps it: only a
//! bucket's `AbortIncompleteMultipartUpload` lifecycle rule frees its space; object_store 0.13
//! offers no `ListMultipartUploads`, so an archiver cannot find its old uploads to abort them),
//! and the restarted archiver uploads the file again from its first part.
//!
//! The create-only rule holds on the complete too. object_store 0.13 completes a multipart
//! upload without a condition in its public API, so the complete goes through a second
//! client whose requests all carry `If-None-Match: *` (AWS S3 honours it on
//! CompleteMultipartUpload since 2024 and answers 412; so does SeaweedFS 4.48, which the
//! tests hold): a name taken while the parts travelled is never replaced. Before the complete
//! the name is also looked up (a HEAD), and a taken name aborts the upload; on a store that
//! ignored the header, that look-up is the whole check, and a writer that took the name
//! between the HEAD and the complete would be overwritten.
//!
//! The calls are async; they run on a current-thread tokio runtime on a thread of this
//! target's own, started at its first use and ended when the last handle goes, and the
//! blocking methods here wait for them. So the archiver's blocking job stays one job (read,
//! compress, put, store the position), and no actor thread ever waits on the network.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::header::{HeaderMap, HeaderValue, IF_NONE_MATCH};

use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::TryStreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::multipart::{MultipartStore, PartId};
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
/// The part size when `[archive] multipart_part_size` is unset: a 16 MiB segment, the common
/// case, goes as two parts in parallel, and a zstd-compressed one mostly as one PUT; the
/// choice is a guess.
pub const DEFAULT_PART_SIZE: u64 = 8 << 20;
/// The smallest `multipart_part_size` accepted: S3's minimum for every part but the last,
/// which SeaweedFS enforces too (`EntityTooSmall` at the complete).
pub const MIN_PART_SIZE: u64 = 5 << 20;
/// Parts of one object in flight at once. A guess: enough to fill a link that one request
/// does not, few enough that a 16 MiB segment's parts are all in flight.
pub const PARALLEL_PARTS: usize = 4;
/// Set (to anything) in a node's environment with the `failpoints` feature, it holds every
/// multipart upload after its parts are stored and before it is completed, for the kill -9
/// test; it logs `FAILPOINT_HOLD_LINE` when it starts holding.
#[cfg(feature = "failpoints")]
pub const FAILPOINT_HOLD_ENV: &str = "WALSERVER_TEST_FAILPOINT_ARCHIVE_HOLD_COMPLETE";
#[cfg(feature = "failpoints")]
pub const FAILPOINT_HOLD_LINE: &str = "fail point wal_archive::s3::complete::hold";

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
    /// Objects larger than this go as multipart uploads of parts this size;
    /// [`DEFAULT_PART_SIZE`] when unset.
    pub multipart_part_size: Option<u64>,
}

impl fmt::Debug for S3Options {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The secret and the token never reach a log line.
        f.debug_struct("S3Options")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("allow_http", &self.allow_http)
            .field("access_key_id", &self.access_key_id)
            .field("multipart_part_size", &self.multipart_part_size)
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
    stores: Stores,
    runtime: tokio::runtime::Handle,
    /// Dropping it ends the runtime's thread.
    _stop: oneshot::Sender<()>,
}

/// One bucket through two clients.
#[derive(Clone)]
struct Stores {
    store: AmazonS3,
    /// Every request carries `If-None-Match: *`; used only to complete multipart uploads.
    if_absent: AmazonS3,
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
        if let Some(size) = options.multipart_part_size {
            if size < MIN_PART_SIZE {
                return Err(format!(
                    "[archive] multipart_part_size {size} is below the smallest accepted, {MIN_PART_SIZE} bytes"
                ));
            }
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
        self.call(move |s| async move {
            match s.store.get(&key).await {
                Ok(got) => got.bytes().await.map(Some),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        })?
        .map_err(|e| store_error(format!("reading {url}"), e))
    }

    /// Creates the object `name` holding `bytes` unless one exists: `true` if it was
    /// created, `false` if the name was taken (the caller judges what is there). An object
    /// larger than one part goes as a multipart upload (see the module's story). Blocking.
    pub fn create(&self, name: &str, bytes: Bytes) -> Result<bool> {
        let key = ObjectPath::from(self.key(name));
        let url = self.url_of(name);
        let part_size = self
            .options
            .multipart_part_size
            .unwrap_or(DEFAULT_PART_SIZE);
        let part_size = usize::try_from(part_size).unwrap_or(usize::MAX);
        if bytes.len() > part_size {
            return self
                .call(move |s| create_in_parts(s, key, bytes, part_size))?
                .map_err(|e| store_error(format!("putting {url} in parts"), e));
        }
        self.call(move |s| async move {
            let opts = PutOptions {
                mode: PutMode::Create,
                ..PutOptions::default()
            };
            match s.store.put_opts(&key, PutPayload::from(bytes), opts).await {
                Ok(_) => Ok(true),
                Err(object_store::Error::AlreadyExists { .. }) => Ok(false),
                Err(e) => Err(e),
            }
        })?
        .map_err(|e| store_error(format!("putting {url}"), e))
    }

    /// Whether the store honours `If-None-Match: *`, which every create here relies on:
    /// creates `name` twice with the condition, then removes it, whatever happened. `true`
    /// if the second create found the name taken; `false` if it succeeded, which a store
    /// that ignores the header answers. Blocking.
    pub fn honours_create_if_absent(&self, name: &str) -> Result<bool> {
        let body = Bytes::from_static(b"a probe of the store's If-None-Match; removed at once\n");
        let created = self.create(name, body.clone()).and_then(|first| {
            if !first {
                return Err(ArchiveError::io(
                    format!("probing {}", self.url_of(name)),
                    std::io::Error::other("the probe's name was taken before its first create"),
                ));
            }
            self.create(name, body)
        });
        // A probe left behind is a small object of a name no reader takes; a failed removal
        // does not change what the creates showed.
        if let Err(e) = self.delete(name) {
            tracing::warn!(error = %e, "could not remove the store's probe object");
        }
        Ok(!created?)
    }

    /// Whether the object `name` exists (a HEAD request). Blocking.
    pub fn exists(&self, name: &str) -> Result<bool> {
        let key = ObjectPath::from(self.key(name));
        let url = self.url_of(name);
        self.call(move |s| async move {
            match s.store.head(&key).await {
                Ok(_) => Ok(true),
                Err(object_store::Error::NotFound { .. }) => Ok(false),
                Err(e) => Err(e),
            }
        })?
        .map_err(|e| store_error(format!("looking up {url}"), e))
    }

    /// The object `name`'s `Last-Modified` time, `None` if there is none. Blocking.
    pub fn stored_at(&self, name: &str) -> Result<Option<std::time::SystemTime>> {
        let key = ObjectPath::from(self.key(name));
        let url = self.url_of(name);
        let meta = self
            .call(move |s| async move {
                match s.store.head(&key).await {
                    Ok(m) => Ok(Some(m)),
                    Err(object_store::Error::NotFound { .. }) => Ok(None),
                    Err(e) => Err(e),
                }
            })?
            .map_err(|e| store_error(format!("looking up {url}"), e))?;
        Ok(meta.map(|m| {
            let secs = u64::try_from(m.last_modified.timestamp()).unwrap_or(0);
            std::time::UNIX_EPOCH + Duration::new(secs, m.last_modified.timestamp_subsec_nanos())
        }))
    }

    /// Removes the object `name`; an absent one is not an error. Blocking.
    pub fn delete(&self, name: &str) -> Result<()> {
        let key = ObjectPath::from(self.key(name));
        let url = self.url_of(name);
        self.call(move |s| async move {
            match s.store.delete(&key).await {
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
        let metas = self
            .call(
                move |s| async move { s.store.list(prefix.as_ref()).try_collect::<Vec<_>>().await },
            )?
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
        F: FnOnce(Stores) -> Fut,
        Fut: Future<Output = T> + Send + 'static,
    {
        let client = self.client()?;
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let fut = call(client.stores.clone());
        client.runtime.spawn(async move {
            // The finished future (and the request body it held, a segment's bytes that the
            // caller's thread reuses once no one else holds them) is dropped before the
            // answer wakes the caller.
            let out = fut.await;
            let _ = tx.send(out);
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
        let store = self.build_store(ClientOptions::new())?;
        let mut if_absent = HeaderMap::new();
        if_absent.insert(IF_NONE_MATCH, HeaderValue::from_static("*"));
        let if_absent = self.build_store(ClientOptions::new().with_default_headers(if_absent))?;
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
            stores: Stores { store, if_absent },
            runtime: handle,
            _stop: stop,
        })
    }

    fn build_store(&self, client: ClientOptions) -> Result<AmazonS3> {
        let o = &self.options;
        // Over TLS the body's integrity is TLS's, so the signature covers no hash of it
        // (S3's UNSIGNED-PAYLOAD): that would be a second pass of SHA-256 over every segment,
        // about 12 ms of CPU per 16 MiB even with the CPU's SHA extensions. Over plain http
        // the hash is the body's only protection in transit, so it stays.
        let tls = o
            .endpoint
            .as_deref()
            .is_none_or(|e| e.starts_with("https://"));
        let mut b = AmazonS3Builder::new()
            .with_unsigned_payload(tls)
            .with_bucket_name(&self.bucket)
            .with_region(o.region.as_deref().unwrap_or("us-east-1"))
            .with_allow_http(o.allow_http)
            .with_client_options(
                client
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
        b.build()
            .map_err(|e| store_error(format!("configuring s3://{}", self.bucket), e))
    }
}

/// Uploads `bytes` to `key` in parts of `part_size` and completes the upload only if `key`
/// is absent: `true` if it was created, `false` if the name was taken. Anything but a
/// completed upload is aborted (best effort: an abort that fails leaves an invisible upload).
async fn create_in_parts(
    s: Stores,
    key: ObjectPath,
    bytes: Bytes,
    part_size: usize,
) -> object_store::Result<bool> {
    let id = s.store.create_multipart(&key).await?;
    let done = upload_and_complete(&s, &key, &id, bytes, part_size).await;
    if !matches!(done, Ok(true)) {
        if let Err(e) = s.store.abort_multipart(&key, &id).await {
            tracing::warn!(key = %key, error = %e, "could not abort a multipart upload; it stays invisible");
        }
    }
    done
}

async fn upload_and_complete(
    s: &Stores,
    key: &ObjectPath,
    id: &String,
    bytes: Bytes,
    part_size: usize,
) -> object_store::Result<bool> {
    let parts = bytes.len().div_ceil(part_size);
    let parts: Vec<PartId> = futures_util::stream::iter(0..parts)
        .map(|i| {
            let part = bytes.slice(i * part_size..bytes.len().min((i + 1) * part_size));
            s.store.put_part(key, id, i, PutPayload::from(part))
        })
        .buffered(PARALLEL_PARTS)
        .try_collect()
        .await?;
    #[cfg(feature = "failpoints")]
    if std::env::var_os(FAILPOINT_HOLD_ENV).is_some() {
        tracing::warn!(key = %key, "{FAILPOINT_HOLD_LINE}: every part stored, holding before the complete");
        std::future::pending::<()>().await;
    }
    match s.store.head(key).await {
        Ok(_) => return Ok(false),
        Err(object_store::Error::NotFound { .. }) => {}
        Err(e) => return Err(e),
    }
    match s.if_absent.complete_multipart(key, id, parts).await {
        Ok(_) => Ok(true),
        Err(
            object_store::Error::Precondition { .. } | object_store::Error::AlreadyExists { .. },
        ) => Ok(false),
        Err(e) => Err(e),
    }
}

fn store_error(context: String, source: object_store::Error) -> ArchiveError {
    ArchiveError::Store {
        context,
        source: Box::new(source),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(server: &pg_testkit::SeaweedServer, part_size: u64) -> S3Target {
        let options = S3Options {
            endpoint: Some(server.endpoint()),
            allow_http: true,
            access_key_id: Some(pg_testkit::SEAWEED_ACCESS_KEY_ID.into()),
            secret_access_key: Some(pg_testkit::SEAWEED_SECRET_ACCESS_KEY.into()),
            multipart_part_size: Some(part_size),
            ..S3Options::default()
        };
        S3Target::parse(&format!("{}/mp", server.bucket()), &options).unwrap()
    }

    /// SeaweedFS honours `If-None-Match: *`: the store's probe passes and leaves nothing
    /// behind. An object larger than a part goes in parts and arrives whole; a taken name is
    /// never replaced by an upload in parts, neither when it was taken before (the HEAD) nor
    /// while the parts travelled (the complete's `If-None-Match: *`). One SeaweedFS for both,
    /// since starting one is most of either's time.
    #[test]
    fn an_upload_in_parts_creates_once_and_never_overwrites() {
        let server = pg_testkit::SeaweedServer::start();
        let t = target(&server, MIN_PART_SIZE);
        crate::ArchiveTarget::S3(t.clone())
            .check_create_if_absent(wal_types::SystemId(7))
            .unwrap();
        assert_eq!(t.list().unwrap(), vec![]);
        let raw = |name: &str| server.get_raw(&format!("mp/{name}")).unwrap();
        // Three parts, the last one short.
        let bytes: Vec<u8> = (0..(2 * MIN_PART_SIZE + 1000) as u32)
            .map(|i| (i % 251) as u8)
            .collect();
        assert!(t.create("a", bytes.clone().into()).unwrap());
        assert_eq!(raw("a").as_deref(), Some(&bytes[..]));
        assert!(!t.create("a", bytes.iter().map(|b| !b).collect()).unwrap());
        assert_eq!(raw("a").as_deref(), Some(&bytes[..]));

        // The name taken after the parts were stored: the conditional complete refuses.
        let key = ObjectPath::from("mp/b");
        let taken = t
            .call(move |s2| async move {
                let id = s2.store.create_multipart(&key).await?;
                let part = s2
                    .store
                    .put_part(&key, &id, 0, PutPayload::from(vec![1u8; 100]))
                    .await?;
                s2.store
                    .put(&key, PutPayload::from(b"foreign".to_vec()))
                    .await?;
                let done = s2.if_absent.complete_multipart(&key, &id, vec![part]).await;
                let _ = s2.store.abort_multipart(&key, &id).await;
                Ok::<_, object_store::Error>(done)
            })
            .unwrap()
            .unwrap();
        assert!(
            matches!(taken, Err(object_store::Error::Precondition { .. })),
            "{taken:?}"
        );
        assert_eq!(raw("b").as_deref(), Some(&b"foreign"[..]));
    }

    /// A store that lets a second create through is refused, and the probe is removed.
    #[test]
    fn a_store_that_ignores_if_none_match_is_refused_and_the_probe_removed() {
        let store = crate::careless::CarelessStore::start();
        let options = S3Options {
            endpoint: Some(store.endpoint()),
            allow_http: true,
            access_key_id: Some("k".into()),
            secret_access_key: Some("s".into()),
            ..S3Options::default()
        };
        let t = crate::ArchiveTarget::S3(S3Target::parse("b/p", &options).unwrap());
        let e = t
            .check_create_if_absent(wal_types::SystemId(7))
            .unwrap_err();
        let ArchiveError::NoCreateIfAbsent { probe, .. } = &e else {
            panic!("{e}")
        };
        assert!(probe.starts_with("walserver.probe.7."), "{probe}");
        assert!(e.to_string().contains("ignores If-None-Match"), "{e}");
        let key = format!("/b/p/{probe}");
        let req = |m: &str| (m.to_string(), key.clone());
        assert_eq!(
            store.requests(),
            vec![req("PUT"), req("PUT"), req("DELETE")]
        );
    }

    #[test]
    fn a_part_size_below_the_floor_is_refused() {
        let o = S3Options {
            access_key_id: Some("k".into()),
            secret_access_key: Some("s".into()),
            multipart_part_size: Some(MIN_PART_SIZE - 1),
            ..S3Options::default()
        };
        let e = S3Target::parse("b/p", &o).unwrap_err();
        assert!(e.contains("multipart_part_size"), "{e}");
    }
}
