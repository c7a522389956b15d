//! A stream's chunks parsed one after the other, each going on from the
//! last one's scan where they share their leading members, read exactly
//! as each parsed alone: same members, places, values, counted text and
//! refusals. Each chunk keeps a share of the last one's bytes (its first
//! input byte says how much) and adds the rest of its piece of the input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use modelgate::edit_fuzzing::parse_after_agrees;

fuzz_target!(|input: &[u8]| {
    let mut chunks: Vec<Vec<u8>> = Vec::new();
    // 0xFF never appears in UTF-8, so no valid chunk needs it.
    for piece in input.split(|&byte| byte == 0xFF).take(64) {
        let Some((&kept, added)) = piece.split_first() else {
            continue;
        };
        let last = chunks.last().map_or(&[][..], Vec::as_slice);
        let kept = usize::from(kept) * last.len() / 254;
        let mut chunk = last[..kept.min(last.len())].to_vec();
        chunk.extend_from_slice(added);
        chunks.push(chunk);
    }
    parse_after_agrees(&chunks);
});
