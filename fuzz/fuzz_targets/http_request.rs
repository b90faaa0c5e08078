//! The request-head reader of `cachalot serve`, fed in pieces as a socket delivers them: it
//! must refuse or accept every input without panicking and never hold more than its limit.
#![no_main]

#[path = "../../cli/src/serve/request.rs"]
#[allow(dead_code, reason = "the server uses all of it; this target part")]
mod request;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    // The first byte chooses the piece size, so that heads split at every place are tried.
    let Some((&piece, rest)) = bytes.split_first() else { return };
    let mut head = request::Head::default();
    for chunk in rest.chunks(usize::from(piece).max(1)) {
        match head.push(chunk) {
            Ok(None) => assert!(head.received() <= request::MAX_HEAD_BYTES),
            Ok(Some(request)) => {
                assert!(request.target.starts_with('/'));
                return;
            }
            Err(_) => return,
        }
    }
    let _ = request::parse(rest);
});
