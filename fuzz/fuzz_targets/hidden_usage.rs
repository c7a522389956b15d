//! The stream filter that hides the usage the gateway asked for, on
//! arbitrary bytes cut at arbitrary points: never panics, never sends an
//! empty data frame, gives the same bytes however the stream is cut (byte
//! by byte too), only ever takes bytes out, and changes nothing in a
//! stream that never names `usage`. The passthrough changes nothing at all.
#![no_main]

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http_body::{Body, Frame};
use libfuzzer_sys::fuzz_target;
use modelgate::credit::HiddenUsage;

/// A body whose chunks are all there at once.
struct Chunks(VecDeque<Bytes>);

impl Body for Chunks {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.0.pop_front().map(|chunk| Ok(Frame::data(chunk))))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_empty()
    }
}

/// All the data `body` gives, checking each frame.
fn drain(body: HiddenUsage<Chunks>) -> Vec<u8> {
    let mut body = std::pin::pin!(body);
    let mut cx = Context::from_waker(Waker::noop());
    let mut out = Vec::new();
    loop {
        match body.as_mut().poll_frame(&mut cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let data = frame.into_data().expect("data in, data out");
                assert!(!data.is_empty(), "an empty data frame");
                out.extend_from_slice(&data);
            }
            Poll::Ready(None) => break,
            Poll::Ready(Some(Err(never))) => match never {},
            Poll::Pending => panic!("every chunk is ready"),
        }
    }
    assert!(body.is_end_stream());
    out
}

fn chunks(stream: &[u8], cuts: &[u16]) -> Chunks {
    let mut cuts: Vec<usize> = cuts
        .iter()
        .map(|&cut| usize::from(cut) % (stream.len() + 1))
        .collect();
    cuts.sort_unstable();
    let mut parts = VecDeque::new();
    let mut from = 0;
    for cut in cuts {
        parts.push_back(Bytes::copy_from_slice(&stream[from..cut]));
        from = cut;
    }
    parts.push_back(Bytes::copy_from_slice(&stream[from..]));
    Chunks(parts)
}

fuzz_target!(|input: (Vec<u16>, &[u8])| {
    let (cuts, stream) = input;
    let whole = drain(HiddenUsage::new(chunks(stream, &[])));
    assert_eq!(drain(HiddenUsage::new(chunks(stream, &cuts))), whole);
    let bytewise = Chunks(
        stream
            .iter()
            .map(|&byte| Bytes::copy_from_slice(&[byte]))
            .collect(),
    );
    assert_eq!(drain(HiddenUsage::new(bytewise)), whole);
    assert!(whole.len() <= stream.len());
    let names_usage = |needle: &[u8]| stream.windows(needle.len()).any(|part| part == needle);
    if !names_usage(b"usage") && !names_usage(b"\\u") {
        assert_eq!(whole, stream);
    }
    assert_eq!(
        drain(HiddenUsage::passthrough(chunks(stream, &cuts))),
        stream
    );
});
