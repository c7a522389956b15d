//! The client's address: [`ClientAddr`], which the server puts into each
//! request's extensions, and [`ClientAddrLayer`], which replaces it with
//! the address in `X-Forwarded-For` when, and only when, the connection
//! comes from a proxy the operator trusts.
//!
//! Per-client limits key on this address: the failed-authentication limit
//! of [`BearerAuth`](crate::auth::BearerAuth) and the webhook routes' rate
//! windows and in-flight counts. A client can write any `X-Forwarded-For`
//! it likes, so the header is read only from a trusted peer, and only as
//! far as the hops the trusted proxies appended: walking from the right,
//! the first address that is not a trusted proxy is the client.
//!
//! ```
//! use std::net::IpAddr;
//! use bytes::Bytes;
//! use http::{Request, Response};
//! use http_body_util::Full;
//! use modelgate::client_addr::{ClientAddr, ClientAddrLayer, TrustedProxies};
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let trusted = TrustedProxies::parse(&["10.0.0.0/8"]).unwrap();
//! let service = ServiceBuilder::new()
//!     .layer(ClientAddrLayer::new(trusted))
//!     .service(service_fn(|request: Request<Full<Bytes>>| async move {
//!         let client = request.extensions().get::<ClientAddr>().unwrap().0;
//!         Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from(client.to_string()))))
//!     }));
//!
//! // The server inserts the peer's address; a trusted peer's header names the client.
//! let mut request = Request::get("/").header("x-forwarded-for", "203.0.113.7, 10.1.2.3").body(Full::new(Bytes::new())).unwrap();
//! request.extensions_mut().insert(ClientAddr("10.9.9.9".parse::<IpAddr>().unwrap()));
//! let response = service.oneshot(request).await.unwrap();
//! assert_eq!(http_body_util::BodyExt::collect(response.into_body()).await.unwrap().to_bytes(), "203.0.113.7");
//! # }
//! ```

use std::net::IpAddr;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{HeaderMap, HeaderName, Request, Response};
use ipnet::IpNet;
use tower_layer::Layer;
use tower_service::Service;

use crate::answer::AnswerFuture;
use crate::error::{ErrorKind, GatewayError};
use crate::response_body::ResponseBody;

/// `X-Forwarded-For`: the addresses a request passed through, client first.
pub const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// Most `X-Forwarded-For` entries read: a longer chain is refused rather
/// than walked.
pub const MAX_FORWARDED_HOPS: usize = 32;

/// The client's address, which the server puts into the request's
/// extensions (the peer of the connection); [`ClientAddrLayer`] replaces it
/// with the forwarded address behind a trusted proxy. Requests without one
/// share one count wherever limits are per client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ClientAddr(pub IpAddr);

/// The networks of the proxies in front of the gateway whose
/// `X-Forwarded-For` is believed. Empty (the default): the header is
/// ignored and the connection's peer is the client.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TrustedProxies {
    networks: Vec<IpNet>,
}

/// Why a trusted proxy's `X-Forwarded-For` could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ForwardedForError {
    /// An entry is not an IP address.
    #[error("X-Forwarded-For entry {0:?} is not an IP address")]
    NotAnAddress(String),
    /// More entries than [`MAX_FORWARDED_HOPS`].
    #[error("X-Forwarded-For lists more than {MAX_FORWARDED_HOPS} addresses")]
    TooLong,
    /// The header is not visible ASCII.
    #[error("X-Forwarded-For is not visible ASCII")]
    NotText,
}

impl TrustedProxies {
    /// Trusts nobody: the connection's peer is always the client.
    pub fn none() -> Self {
        TrustedProxies::default()
    }

    /// Reads networks (`10.0.0.0/8`, `fd00::/8`) and single addresses
    /// (`192.0.2.1`, `::1`); the message names the first entry that is
    /// neither.
    pub fn parse<T: AsRef<str>>(entries: &[T]) -> Result<Self, String> {
        let networks = entries
            .iter()
            .map(|entry| {
                let entry = entry.as_ref().trim();
                entry
                    .parse::<IpNet>()
                    .or_else(|_| entry.parse::<IpAddr>().map(IpNet::from))
                    .map(|network| network.trunc())
                    .map_err(|_| {
                        format!(
                            "trusted_proxies: {entry:?} is neither an IP address nor a network such as 10.0.0.0/8"
                        )
                    })
            })
            .collect::<Result<_, _>>()?;
        Ok(TrustedProxies { networks })
    }

    /// Whether no proxy is trusted.
    pub fn is_empty(&self) -> bool {
        self.networks.is_empty()
    }

    /// Whether `address` is one of the trusted proxies.
    pub fn contains(&self, address: IpAddr) -> bool {
        let address = canonical(address);
        self.networks
            .iter()
            .any(|network| network.contains(&address))
    }

    /// The client of a request that arrived from `peer`: `peer` itself
    /// unless it is trusted; then, walking `X-Forwarded-For` from the
    /// right, the first address that is not a trusted proxy (or the
    /// leftmost, when every hop is trusted).
    pub fn client(&self, peer: IpAddr, headers: &HeaderMap) -> Result<IpAddr, ForwardedForError> {
        let mut client = canonical(peer);
        if !self.contains(client) {
            return Ok(client);
        }
        // Several headers are one list, in order (RFC 9110 §5.3).
        let mut hops = Vec::new();
        for value in headers.get_all(X_FORWARDED_FOR) {
            let value = value.to_str().map_err(|_| ForwardedForError::NotText)?;
            for entry in value.split(',') {
                if hops.len() == MAX_FORWARDED_HOPS {
                    return Err(ForwardedForError::TooLong);
                }
                hops.push(entry.trim());
            }
        }
        for entry in hops.iter().rev() {
            if entry.is_empty() {
                continue;
            }
            let hop = parse_hop(entry)
                .ok_or_else(|| ForwardedForError::NotAnAddress(entry.chars().take(64).collect()))?;
            client = canonical(hop);
            if !self.contains(client) {
                break;
            }
        }
        Ok(client)
    }
}

/// An entry as proxies write them: an address, perhaps with a port
/// (`192.0.2.1:4711`, `[2001:db8::1]:4711`).
fn parse_hop(entry: &str) -> Option<IpAddr> {
    if let Ok(address) = entry.parse::<IpAddr>() {
        return Some(address);
    }
    if let Ok(socket) = entry.parse::<std::net::SocketAddr>() {
        return Some(socket.ip());
    }
    entry
        .strip_prefix('[')
        .and_then(|rest| rest.strip_suffix(']'))
        .and_then(|inner| inner.parse().ok())
}

/// An IPv4 client reached over an IPv6 socket is the IPv4 client.
pub(crate) fn canonical(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map(IpAddr::V4)
            .unwrap_or(IpAddr::V6(v6)),
        v4 => v4,
    }
}

/// The group `address` counts in for per-client limits: an IPv4 address
/// alone, an IPv6 address by its /64 (which one host usually holds
/// whole); `None` for requests without an address, which share one group.
pub(crate) fn address_group(address: Option<IpAddr>) -> Option<u128> {
    address.map(|address| match canonical(address) {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        // The /64, tagged so it never equals an IPv4 group.
        IpAddr::V6(v6) => (u128::from(v6) & !((1u128 << 64) - 1)) | 1,
    })
}

/// Applies [`ClientAddrService`]: behind trusted proxies, the client's
/// address comes from `X-Forwarded-For`.
///
/// Cheap to clone: the networks sit behind an `Arc`.
#[derive(Clone, Debug, Default)]
pub struct ClientAddrLayer {
    trusted: Arc<TrustedProxies>,
    peer_from: Option<PeerFrom>,
}

/// Reads the peer's address from what a server put into a request's
/// extensions, for servers that do not insert a [`ClientAddr`] (axum puts
/// in its `ConnectInfo<SocketAddr>`: [`axum_connect_info`]).
pub type PeerFrom = fn(&http::Extensions) -> Option<IpAddr>;

impl ClientAddrLayer {
    /// Believes `X-Forwarded-For` from the `trusted` proxies only.
    pub fn new(trusted: TrustedProxies) -> Self {
        ClientAddrLayer {
            trusted: Arc::new(trusted),
            peer_from: None,
        }
    }

    /// Where the peer's address is when the server put in no
    /// [`ClientAddr`]: `peer_from` reads it from the request's extensions,
    /// and the layer inserts it as a `ClientAddr` (then reads
    /// `X-Forwarded-For` from trusted peers as usual).
    ///
    /// ```
    /// use std::net::{IpAddr, SocketAddr};
    /// use modelgate::client_addr::{ClientAddrLayer, TrustedProxies};
    ///
    /// /// The address a server of one's own put in.
    /// #[derive(Clone)]
    /// struct Peer(SocketAddr);
    ///
    /// let layer = ClientAddrLayer::new(TrustedProxies::none())
    ///     .peer_from(|extensions| extensions.get::<Peer>().map(|peer| peer.0.ip()));
    /// # let _ = layer;
    /// ```
    pub fn peer_from(mut self, peer_from: PeerFrom) -> Self {
        self.peer_from = Some(peer_from);
        self
    }
}

/// The peer's address axum puts in a request served with
/// `into_make_service_with_connect_info::<SocketAddr>()`, for
/// [`ClientAddrLayer::peer_from`] (feature `axum`).
///
/// ```
/// use std::net::SocketAddr;
/// use axum::extract::ConnectInfo;
/// use modelgate::client_addr::{ClientAddrLayer, TrustedProxies, axum_connect_info};
///
/// let layer = ClientAddrLayer::new(TrustedProxies::none()).peer_from(axum_connect_info);
/// let mut extensions = http::Extensions::new();
/// extensions.insert(ConnectInfo("192.0.2.1:4000".parse::<SocketAddr>().unwrap()));
/// assert_eq!(axum_connect_info(&extensions), Some("192.0.2.1".parse().unwrap()));
/// # let _ = layer;
/// ```
#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub fn axum_connect_info(extensions: &http::Extensions) -> Option<IpAddr> {
    extensions
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|info| info.0.ip())
}

impl<S> Layer<S> for ClientAddrLayer {
    type Service = ClientAddrService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ClientAddrService {
            inner,
            trusted: Arc::clone(&self.trusted),
            peer_from: self.peer_from,
        }
    }
}

/// Replaces the [`ClientAddr`] the server put in with the forwarded
/// client's when the peer is a trusted proxy. A trusted proxy's
/// `X-Forwarded-For` that cannot be read is a 400: guessing would put
/// every client behind that proxy into one count, or let one choose its
/// own. `Forwarded` (RFC 7239) is not read; a trusted proxy must send
/// `X-Forwarded-For`.
///
/// Ready when the inner service is: the requests it passes on call it at
/// once (a limit below it holds its own answers too).
#[derive(Clone, Debug)]
pub struct ClientAddrService<S> {
    inner: S,
    trusted: Arc<TrustedProxies>,
    peer_from: Option<PeerFrom>,
}

impl<S, B, ResBody> Service<Request<B>> for ClientAddrService<S>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = AnswerFuture<S, B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The inner service's readiness: a request passed on is called at
        // once, with no clone of the services below.
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        if let Some(peer_from) = self.peer_from
            && request.extensions().get::<ClientAddr>().is_none()
            && let Some(peer) = peer_from(request.extensions())
        {
            request.extensions_mut().insert(ClientAddr(peer));
        }
        if !self.trusted.is_empty()
            && let Some(ClientAddr(peer)) = request.extensions().get::<ClientAddr>().copied()
        {
            match self.trusted.client(peer, request.headers()) {
                Ok(client) => {
                    request.extensions_mut().insert(ClientAddr(client));
                }
                Err(error) => {
                    let response = GatewayError::new(
                            ErrorKind::InvalidRequest,
                            format!("{error}; the proxy in front of the gateway must send one address per hop"),
                        )
                        .with_metadata("reason", "malformed_forwarded_for")
                        .to_response();
                    return AnswerFuture::answering(Box::pin(std::future::ready(response)));
                }
            }
        }
        AnswerFuture::passing(self.inner.call(request))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn headers(values: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append(X_FORWARDED_FOR, value.parse().unwrap());
        }
        headers
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn an_untrusted_peer_is_the_client_whatever_it_forwards() {
        let trusted = TrustedProxies::parse(&["10.0.0.0/8"]).unwrap();
        let forged = headers(&["1.2.3.4"]);
        assert_eq!(
            trusted.client(ip("198.51.100.1"), &forged),
            Ok(ip("198.51.100.1"))
        );
        assert_eq!(
            TrustedProxies::none().client(ip("10.0.0.1"), &forged),
            Ok(ip("10.0.0.1"))
        );
    }

    #[test]
    fn behind_trusted_proxies_the_first_untrusted_hop_from_the_right_is_the_client() {
        let trusted = TrustedProxies::parse(&["10.0.0.0/8", "2001:db8::1"]).unwrap();
        // The client forged the first entry; the proxies appended the rest.
        let chain = headers(&["6.6.6.6, 203.0.113.7", "10.0.0.2"]);
        assert_eq!(
            trusted.client(ip("10.0.0.1"), &chain),
            Ok(ip("203.0.113.7"))
        );
        assert_eq!(
            trusted.client(ip("2001:db8::1"), &chain),
            Ok(ip("203.0.113.7"))
        );
        // Every hop trusted: the leftmost.
        let inner = headers(&["10.0.0.9, 10.0.0.2"]);
        assert_eq!(trusted.client(ip("10.0.0.1"), &inner), Ok(ip("10.0.0.9")));
        // No header: the proxy itself.
        assert_eq!(
            trusted.client(ip("10.0.0.1"), &HeaderMap::new()),
            Ok(ip("10.0.0.1"))
        );
        // Ports and brackets as proxies write them; a mapped IPv4 is IPv4.
        let ported = headers(&["[2001:db8::7]:4711"]);
        assert_eq!(
            trusted.client(ip("10.0.0.1"), &ported),
            Ok(ip("2001:db8::7"))
        );
        let ported = headers(&["203.0.113.9:80"]);
        assert_eq!(
            trusted.client(ip("::ffff:10.0.0.1"), &ported),
            Ok(ip("203.0.113.9"))
        );
    }

    #[test]
    fn junk_is_refused_only_where_it_would_be_read() {
        let trusted = TrustedProxies::parse(&["10.0.0.0/8"]).unwrap();
        // Left of the client: never read.
        let chain = headers(&["junk, 203.0.113.7"]);
        assert_eq!(
            trusted.client(ip("10.0.0.1"), &chain),
            Ok(ip("203.0.113.7"))
        );
        let chain = headers(&["203.0.113.7, junk"]);
        assert_eq!(
            trusted.client(ip("10.0.0.1"), &chain),
            Err(ForwardedForError::NotAnAddress("junk".into()))
        );
        let long = vec!["10.0.0.3"; MAX_FORWARDED_HOPS + 1].join(",");
        assert_eq!(
            trusted.client(ip("10.0.0.1"), &headers(&[&long])),
            Err(ForwardedForError::TooLong)
        );
    }

    #[test]
    fn config_entries_are_networks_or_addresses() {
        let trusted = TrustedProxies::parse(&["192.0.2.1", "fd00::/8", " 10.1.0.0/16 "]).unwrap();
        assert!(trusted.contains(ip("192.0.2.1")));
        assert!(!trusted.contains(ip("192.0.2.2")));
        assert!(trusted.contains(ip("fd12::1")));
        assert!(trusted.contains(ip("10.1.200.3")));
        let error = TrustedProxies::parse(&["10.0.0.0/33"]).unwrap_err();
        assert!(error.contains("\"10.0.0.0/33\""), "{error}");
        assert!(TrustedProxies::parse(&["proxy.internal"]).is_err());
    }

    proptest! {
        #[test]
        fn any_header_gives_an_address_or_an_error_never_a_panic(value in "[ -~]{0,200}", peer in any::<[u8; 4]>()) {
            let trusted = TrustedProxies::parse(&["0.0.0.0/0"]).unwrap();
            let mut map = HeaderMap::new();
            if let Ok(value) = value.parse() {
                map.insert(X_FORWARDED_FOR, value);
            }
            let _ = trusted.client(IpAddr::from(peer), &map);
        }

        #[test]
        fn an_untrusted_client_cannot_choose_its_address(forged in "[0-9.,: a-f]{0,100}", last in any::<[u8; 4]>()) {
            // The trusted proxy appends the address it saw; whatever the
            // client wrote before it, that address is the client's.
            let trusted = TrustedProxies::parse(&["10.0.0.0/8"]).unwrap();
            let seen = IpAddr::from(last);
            prop_assume!(!trusted.contains(seen));
            let value = format!("{forged}, {seen}");
            // A header past the hop limit is refused whole, whoever wrote it.
            prop_assume!(value.split(',').count() <= MAX_FORWARDED_HOPS);
            let mut map = HeaderMap::new();
            if let Ok(value) = value.parse() {
                map.insert(X_FORWARDED_FOR, value);
                prop_assert_eq!(trusted.client(ip("10.0.0.1"), &map), Ok(seen));
            }
        }
    }
}
