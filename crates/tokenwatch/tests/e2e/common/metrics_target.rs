// A `/metrics` endpoint on 127.0.0.1 for scrape tests: answers each request (one per
// connection) with the text its closure makes at that moment, and counts the scrapes answered.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub struct MetricsTarget {
    pub addr: SocketAddr,
    hits: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for MetricsTarget {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl MetricsTarget {
    /// Serves `body()` in the Prometheus text format until dropped.
    pub async fn start(body: impl Fn() -> String + Send + Sync + 'static) -> MetricsTarget {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let hits = Arc::new(AtomicUsize::new(0));
        let (counted, body) = (hits.clone(), Arc::new(body));
        let task = tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                let (counted, body) = (counted.clone(), body.clone());
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    let mut got = Vec::new();
                    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                        match sock.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(k) => got.extend_from_slice(&buf[..k]),
                        }
                    }
                    counted.fetch_add(1, Ordering::SeqCst);
                    let text = body();
                    let head = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        text.len()
                    );
                    let _ = sock.write_all(head.as_bytes()).await;
                    let _ = sock.write_all(text.as_bytes()).await;
                    let _ = sock.shutdown().await;
                });
            }
        });
        MetricsTarget { addr, hits, task }
    }

    /// Scrapes answered so far.
    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}
