//! A real S3 endpoint on loopback that ignores `If-None-Match`, as some S3-compatible stores
//! do: every PUT is stored, replacing what was there. No store at hand behaves so (SeaweedFS
//! and AWS S3 honour the header, and a directory's `link(2)` cannot replace), so the tests of
//! the create-if-absent probe run against this one, over real TCP and HTTP through the same
//! object_store client. It answers only what the probe and an archiver's first steps send:
//! PUT (200 with an ETag), DELETE (204) and DeleteObjects (`POST /bucket?delete`, which
//! object_store's delete sends), GET and HEAD of a stored object, 404 otherwise.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// The store; it stops when dropped.
pub(crate) struct CarelessStore {
    addr: SocketAddr,
    /// Every request's method and path, in order; a DeleteObjects request as a DELETE of
    /// each key it names.
    requests: Arc<Mutex<Vec<(String, String)>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl CarelessStore {
    pub(crate) fn start() -> CarelessStore {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("address");
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (log, stopping) = (requests.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut objects: HashMap<String, Vec<u8>> = HashMap::new();
            for conn in listener.incoming() {
                if stopping.load(Ordering::SeqCst) {
                    return;
                }
                if let Ok(conn) = conn {
                    // A broken request only ends its own connection.
                    let _ = serve(conn, &mut objects, &log);
                }
            }
        });
        CarelessStore {
            addr,
            requests,
            stop,
            thread: Some(thread),
        }
    }

    /// The `[archive]` endpoint: `http://127.0.0.1:PORT`.
    pub(crate) fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub(crate) fn requests(&self) -> Vec<(String, String)> {
        self.requests.lock().unwrap().clone()
    }
}

impl Drop for CarelessStore {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept so that the thread sees the flag.
        let _ = TcpStream::connect(self.addr);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Answers one request and closes the connection.
fn serve(
    conn: TcpStream,
    objects: &mut HashMap<String, Vec<u8>>,
    log: &Mutex<Vec<(String, String)>>,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_string();
    let target = parts.next().unwrap_or_default();
    let path = target.split('?').next().unwrap_or_default().to_string();
    let mut length = 0usize;
    loop {
        let mut header = String::new();
        reader.read_line(&mut header)?;
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().unwrap_or(0);
            }
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body)?;
    if method == "POST" && target.ends_with("?delete") {
        // `<Delete><Object><Key>K</Key></Object>...</Delete>`, keys below the bucket.
        let text = String::from_utf8_lossy(&body);
        let keys: Vec<&str> = text
            .split("<Key>")
            .skip(1)
            .filter_map(|k| k.split("</Key>").next())
            .collect();
        let mut reply = String::from("<DeleteResult>");
        for key in keys {
            let object = format!("{path}/{key}");
            objects.remove(&object);
            log.lock().unwrap().push(("DELETE".into(), object));
            reply.push_str(&format!("<Deleted><Key>{key}</Key></Deleted>"));
        }
        reply.push_str("</DeleteResult>");
        let mut out = conn;
        write!(
            out,
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{reply}",
            reply.len()
        )?;
        return out.flush();
    }
    log.lock().unwrap().push((method.clone(), path.clone()));
    // The status, extra headers, and the object whose length the answer declares.
    let (status, headers, object): (&str, &str, &[u8]) = match method.as_str() {
        "PUT" => {
            objects.insert(path, body);
            ("200 OK", "ETag: \"1\"\r\n", &[])
        }
        "DELETE" => {
            objects.remove(&path);
            ("204 No Content", "", &[])
        }
        "GET" | "HEAD" => match objects.get(&path) {
            Some(b) => (
                "200 OK",
                "ETag: \"1\"\r\nLast-Modified: Sun, 06 Dec 2026 12:00:00 GMT\r\n",
                b,
            ),
            None => ("404 Not Found", "", &[]),
        },
        _ => ("404 Not Found", "", &[]),
    };
    let mut out = conn;
    write!(
        out,
        "HTTP/1.1 {status}\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n",
        object.len()
    )?;
    if method != "HEAD" {
        out.write_all(object)?;
    }
    out.flush()
}
