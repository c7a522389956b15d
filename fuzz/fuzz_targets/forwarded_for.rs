//! `TrustedProxies::client` on arbitrary `X-Forwarded-For` values: never
//! panics; an untrusted peer is always the client, whatever it sent; a
//! trusted peer's answer is the peer unless a header was sent.
#![no_main]

use std::net::IpAddr;

use http::{HeaderMap, HeaderValue};
use libfuzzer_sys::fuzz_target;
use modelgate::client_addr::{TrustedProxies, X_FORWARDED_FOR};

fuzz_target!(|input: (&[u8], bool)| {
    let (value, from_trusted) = input;
    let trusted = TrustedProxies::parse(&["10.0.0.0/8", "fd00::/8"]).unwrap();
    let mut headers = HeaderMap::new();
    // Several headers are one list: split the input at NUL bytes.
    for part in value.split(|byte| *byte == 0) {
        if let Ok(part) = HeaderValue::from_bytes(part) {
            headers.append(X_FORWARDED_FOR, part);
        }
    }
    let peer: IpAddr = if from_trusted {
        "10.1.2.3".parse().unwrap()
    } else {
        "198.51.100.1".parse().unwrap()
    };
    match trusted.client(peer, &headers) {
        Ok(client) if !from_trusted => assert_eq!(client, peer),
        // Another address only from a header that names one.
        Ok(client) => assert!(client == peer || !headers.is_empty()),
        Err(error) => {
            assert!(from_trusted, "an untrusted peer's header is never read");
            assert!(!error.to_string().is_empty());
        }
    }
});
