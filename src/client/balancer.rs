//! A joined node's way to several servers, as k3s's agent load balancer: a TCP proxy on a loopback
//! port that every connection of the node's clients goes through, passed on to the server that
//! answered last, or the next one that answers when it is gone. TLS stays end to end (every
//! server's certificate covers the loopback addresses and comes from the one cluster CA), so the
//! proxy sees only bytes. Connections already open to a server that dies break; the clients'
//! keepalives notice and reconnect, and the new connection goes to a server that answers.
//!
//! Written here because it is a few lines of tokio and no crate does this alone.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context as _, Result};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// How long a server may take to accept a connection before the next is tried.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

struct Servers {
    /// `host:port` of each server, in the order given.
    addresses: Vec<String>,
    /// The one that answered last.
    current: AtomicUsize,
}

/// Starts the proxy to `servers` (HTTPS URLs); returns the URL the node's clients use instead.
pub async fn start(servers: &[String], shutdown: CancellationToken) -> Result<String> {
    let addresses = servers
        .iter()
        .map(|url| {
            let rest = url.strip_prefix("https://").with_context(|| format!("{url:?} is not an https:// URL"))?;
            Ok(rest.split('/').next().unwrap_or(rest).to_string())
        })
        .collect::<Result<Vec<_>>>()?;
    let listener = TcpListener::bind(("127.0.0.1", 0)).await.context("binding the load balancer to the servers")?;
    let local = listener.local_addr().context("reading the load balancer's address")?;
    tracing::info!("servers {} reached through the load balancer at {local}", addresses.join(", "));
    let servers = Arc::new(Servers { addresses, current: AtomicUsize::new(0) });
    tokio::spawn(async move {
        loop {
            let (client, _) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!("the load balancer could not accept a connection: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
                () = shutdown.cancelled() => return,
            };
            let (servers, stop) = (servers.clone(), shutdown.clone());
            tokio::spawn(async move {
                let Some(mut server) = servers.connect().await else { return };
                let mut client = client;
                tokio::select! {
                    _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                    () = stop.cancelled() => {}
                }
            });
        }
    });
    Ok(format!("https://{local}"))
}

impl Servers {
    /// A connection to the server that answered last, else to the next that answers.
    async fn connect(&self) -> Option<TcpStream> {
        let first = self.current.load(Ordering::Relaxed);
        let n = self.addresses.len();
        for i in 0..n {
            let index = (first + i) % n;
            let address = &self.addresses[index];
            match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(address)).await {
                Ok(Ok(stream)) => {
                    if index != first {
                        tracing::warn!("server {} cannot be reached: using {address}", self.addresses[first]);
                        self.current.store(index, Ordering::Relaxed);
                    }
                    let _ = stream.set_nodelay(true);
                    return Some(stream);
                }
                Ok(Err(e)) => tracing::debug!("connecting to server {address}: {e}"),
                Err(_) => tracing::debug!("connecting to server {address}: no answer within {CONNECT_TIMEOUT:?}"),
            }
        }
        tracing::warn!("no server answers: tried {}", self.addresses.join(", "));
        None
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    /// A server answering every connection with its name.
    async fn named(name: &'static str) -> (String, tokio::task::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("https://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let _ = conn.write_all(name.as_bytes()).await;
            }
        });
        (url, task)
    }

    async fn ask(url: &str) -> String {
        let mut conn = TcpStream::connect(url.trim_start_matches("https://")).await.unwrap();
        let mut answer = String::new();
        let _ = conn.read_to_string(&mut answer).await;
        answer
    }

    #[tokio::test]
    async fn connections_go_to_the_first_server_that_answers_and_stay_there() {
        let (a, a_task) = named("a").await;
        let (b, _b_task) = named("b").await;
        // A port nothing listens on: refused at once.
        let gone = format!("https://{}", TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap());
        let stop = CancellationToken::new();
        let url = start(&[gone, a, b], stop.clone()).await.unwrap();
        assert_eq!(ask(&url).await, "a");
        assert_eq!(ask(&url).await, "a");
        a_task.abort();
        let _ = a_task.await;
        assert_eq!(ask(&url).await, "b", "a gone: the next one");
        assert_eq!(ask(&url).await, "b");
        stop.cancel();
        assert!(start(&["http://plain:80".into()], CancellationToken::new()).await.is_err());
    }
}
