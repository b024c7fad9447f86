//! Wire tables for both directions: request bytes to [`Request`], malformed
//! bytes to the exact error line memcached sends, and [`Response`]s to reply
//! bytes. Cases marked "memcached 1.6.18" were checked against a real
//! memcached 1.6.18 on 127.0.0.1.

use crate::*;

fn limits() -> Limits {
    Limits::default()
}

fn parse_ok(bytes: &[u8]) -> Request<'_> {
    match parse(bytes, &limits()) {
        Parsed::Complete { request, consumed } => {
            assert_eq!(
                consumed,
                bytes.len(),
                "{:?}",
                String::from_utf8_lossy(bytes)
            );
            request
        }
        other => panic!("{:?} parsed to {other:?}", String::from_utf8_lossy(bytes)),
    }
}

fn keys(text: &[u8]) -> Keys<'_> {
    Keys::new(text, 250, 256).expect("valid test keys")
}

fn mkey(wire: &[u8]) -> MetaKey<'_> {
    MetaKey {
        wire,
        base64: false,
    }
}

fn returns<'a>(flags: &[ReturnFlag], opaque: Option<&'a [u8]>) -> ReturnFlags<'a> {
    let mut r = ReturnFlags::new();
    for &f in flags {
        if f == ReturnFlag::Opaque {
            r.push_opaque(opaque.unwrap_or_default());
        } else {
            r.push(f);
        }
    }
    r
}

mod errors;
mod memcached;
mod replies;
mod requests;
