//! Serves a tower service over real HTTP on a loopback port.

#![allow(dead_code)]

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tower::Service;

/// Serves `service` (HTTP/1 and HTTP/2) on 127.0.0.1 at a free port, on
/// the current runtime, until the test ends.
pub async fn serve<S, B>(service: S) -> SocketAddr
where
    S: Service<Request<Incoming>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let address = listener.local_addr().expect("local address");
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let service = TowerToHyperService::new(service.clone());
            tokio::spawn(async move {
                let _ = Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    address
}

/// A loopback port that refuses every connection for as long as it lives:
/// bound, never listening. A port bound and let go again could be taken by
/// another test's server meanwhile, which would then answer in its place.
pub struct RefusingPort(tokio::net::TcpSocket);

impl RefusingPort {
    pub fn bind() -> Self {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(SocketAddr::from(([127, 0, 0, 1], 0))).unwrap();
        RefusingPort(socket)
    }

    /// `http://127.0.0.1:<port>/v1`, an upstream's base URL.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.0.local_addr().unwrap())
    }
}
