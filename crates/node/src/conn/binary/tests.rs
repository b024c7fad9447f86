//! The translation both ways: which meta command each binary frame becomes, and which
//! binary response each meta reply becomes (statuses, quiet rules, CAS, opaque, key echo).

use super::translate::{Shape, to_text};
use cellcache_proto::Limits;
use cellcache_proto::binary::{
    Command, Frame, NO_CREATE_EXPTIME, Opcode, ParsedResponse, Status, parse_response,
};

fn frame(opcode: Opcode, cas: u64, command: Command<'_>) -> Frame<'_> {
    Frame {
        opcode,
        opaque: 0xa1b2_c3d4,
        cas,
        command,
    }
}

fn text(f: &Frame<'_>) -> (String, Shape) {
    let (t, shape) = to_text(f, &Limits::default()).expect("translatable");
    (String::from_utf8_lossy(&t).into_owned(), shape)
}

/// Every response in `bytes`, owned: (opcode, status, opaque, cas, extras, key, value).
type Owned = (u8, u16, u32, u64, Vec<u8>, Vec<u8>, Vec<u8>);

fn responses(mut bytes: &[u8]) -> Vec<Owned> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        match parse_response(bytes, 1 << 20) {
            ParsedResponse::Complete {
                response: r,
                consumed,
            } => {
                out.push((
                    r.opcode,
                    r.status,
                    r.opaque,
                    r.cas,
                    r.extras.to_vec(),
                    r.key.to_vec(),
                    r.value.to_vec(),
                ));
                bytes = &bytes[consumed..];
            }
            other => panic!("bad response bytes: {other:?}"),
        }
    }
    out
}

fn one(bytes: &[u8]) -> Owned {
    let mut all = responses(bytes);
    assert_eq!(all.len(), 1, "{all:?}");
    all.remove(0)
}

#[test]
fn gets_ask_for_value_flags_and_cas() {
    let (t, _) = text(&frame(Opcode::GetK, 0, Command::Get { key: b"foo" }));
    assert_eq!(t, "mg foo v f c\r\n");
    let (t, _) = text(&frame(
        Opcode::Gat,
        0,
        Command::GetAndTouch {
            key: b"foo",
            exptime: 60,
        },
    ));
    assert_eq!(t, "mg foo v f c T60\r\n");
    let (t, _) = text(&frame(
        Opcode::Touch,
        0,
        Command::Touch {
            key: b"foo",
            exptime: 0,
        },
    ));
    assert_eq!(t, "mg foo f c T0\r\n");
}

#[test]
fn keys_the_text_protocol_forbids_go_base64() {
    let (t, _) = text(&frame(Opcode::Get, 0, Command::Get { key: b"a b\n" }));
    assert_eq!(t, "mg YSBiCg== v f c b\r\n");
    // 186 bytes encode to 248 characters: fits; 188 do not.
    assert!(
        to_text(
            &frame(Opcode::Get, 0, Command::Get { key: &[0; 186] }),
            &Limits::default()
        )
        .is_ok()
    );
    let refused = to_text(
        &frame(Opcode::Get, 0, Command::Get { key: &[0; 188] }),
        &Limits::default(),
    )
    .expect_err("too long for base64");
    let r = one(&refused);
    assert_eq!(r.1, Status::InvalidArguments.code());
    assert_eq!(r.2, 0xa1b2_c3d4);
}

#[test]
fn storage_commands_carry_mode_flags_exptime_and_cas() {
    let store = |opcode, cas| {
        text(&frame(
            opcode,
            cas,
            Command::Store {
                key: b"k",
                value: b"hello",
                flags: 7,
                exptime: 100,
            },
        ))
        .0
    };
    assert_eq!(store(Opcode::Set, 0), "ms k 5 c F7 T100 MS\r\nhello\r\n");
    assert_eq!(store(Opcode::AddQ, 0), "ms k 5 c F7 T100 ME\r\nhello\r\n");
    assert_eq!(
        store(Opcode::Replace, 0),
        "ms k 5 c F7 T100 MR\r\nhello\r\n"
    );
    // Any storage command with a CAS is a compare-and-swap (memcached).
    assert_eq!(
        store(Opcode::Add, 42),
        "ms k 5 c F7 T100 MS C42\r\nhello\r\n"
    );
    let (t, _) = text(&frame(
        Opcode::Prepend,
        3,
        Command::Concat {
            key: b"k",
            value: b"ab",
        },
    ));
    assert_eq!(t, "ms k 2 c MP C3\r\nab\r\n");
}

#[test]
fn counters_create_unless_the_expiration_says_not_to() {
    let arith = |opcode, exptime| {
        text(&frame(
            opcode,
            0,
            Command::Arithmetic {
                key: b"n",
                delta: 5,
                initial: 10,
                exptime,
            },
        ))
        .0
    };
    assert_eq!(arith(Opcode::Increment, 0), "ma n v c D5 N0 J10\r\n");
    assert_eq!(
        arith(Opcode::DecrementQ, NO_CREATE_EXPTIME),
        "ma n v c D5 MD\r\n"
    );
}

#[test]
fn keyless_commands() {
    let t = |opcode, command| text(&frame(opcode, 0, command)).0;
    assert_eq!(
        t(Opcode::Flush, Command::Flush { delay: None }),
        "flush_all\r\n"
    );
    assert_eq!(
        t(Opcode::FlushQ, Command::Flush { delay: Some(5) }),
        "flush_all 5\r\n"
    );
    assert_eq!(t(Opcode::Stat, Command::Stat { group: b"" }), "stats\r\n");
    assert_eq!(
        t(Opcode::Stat, Command::Stat { group: b"items" }),
        "stats items\r\n"
    );
    assert_eq!(t(Opcode::Noop, Command::Noop), "mn\r\n");
    assert_eq!(t(Opcode::Version, Command::Version), "version\r\n");
    assert_eq!(
        t(Opcode::Verbosity, Command::Verbosity { level: 1 }),
        "verbosity 1\r\n"
    );
    assert_eq!(t(Opcode::Quit, Command::Quit), "quit\r\n");
    let bad_group = to_text(
        &frame(Opcode::Stat, 0, Command::Stat { group: b"a\r\nb" }),
        &Limits::default(),
    )
    .expect_err("control bytes");
    assert_eq!(one(&bad_group).1, Status::KeyNotFound.code());
}

fn shape(opcode: Opcode) -> Shape {
    let key: &[u8] = b"key";
    let command = match opcode {
        Opcode::Stat => Command::Stat { group: b"" },
        Opcode::Noop => Command::Noop,
        Opcode::Version => Command::Version,
        Opcode::Quit | Opcode::QuitQ => Command::Quit,
        Opcode::Flush | Opcode::FlushQ => Command::Flush { delay: None },
        _ => Command::Get { key },
    };
    to_text(&frame(opcode, 0, command), &Limits::default())
        .expect("translatable")
        .1
}

#[test]
fn get_hits_carry_flags_cas_value_and_key_when_asked() {
    let r = one(&shape(Opcode::GetK).reply(b"VA 5 f9 c77\r\nhello\r\n"));
    assert_eq!(
        r,
        (
            0x0c,
            0,
            0xa1b2_c3d4,
            77,
            9u32.to_be_bytes().to_vec(),
            b"key".to_vec(),
            b"hello".to_vec()
        )
    );
    let r = one(&shape(Opcode::GetQ).reply(b"VA 0 f0 c1\r\n\r\n"));
    assert_eq!((r.1, r.5.len(), r.6.len()), (0, 0, 0));
}

#[test]
fn get_misses_follow_memcached() {
    let r = one(&shape(Opcode::Get).reply(b"EN\r\n"));
    assert_eq!((r.1, r.6.as_slice()), (1, &b"Not found"[..]));
    let r = one(&shape(Opcode::GetK).reply(b"EN\r\n"));
    assert_eq!((r.1, r.5.as_slice(), r.6.len()), (1, &b"key"[..], 0));
    assert!(shape(Opcode::GetQ).reply(b"EN\r\n").is_empty());
    assert!(shape(Opcode::GatKQ).reply(b"EN\r\n").is_empty());
}

#[test]
fn storage_outcomes_map_to_statuses() {
    let status = |opcode, reply: &[u8]| {
        let bytes = shape(opcode).reply(reply);
        if bytes.is_empty() {
            None
        } else {
            Some(one(&bytes).1)
        }
    };
    assert_eq!(status(Opcode::Set, b"HD c5\r\n"), Some(0));
    assert_eq!(one(&shape(Opcode::Set).reply(b"HD c5\r\n")).3, 5);
    assert_eq!(status(Opcode::SetQ, b"HD c5\r\n"), None);
    assert_eq!(status(Opcode::Add, b"NS\r\n"), Some(2));
    assert_eq!(
        status(Opcode::AddQ, b"NS\r\n"),
        Some(2),
        "errors are never quiet"
    );
    assert_eq!(status(Opcode::Replace, b"NS\r\n"), Some(1));
    assert_eq!(status(Opcode::Append, b"NS\r\n"), Some(5));
    assert_eq!(status(Opcode::Set, b"EX\r\n"), Some(2));
    assert_eq!(status(Opcode::Set, b"NF\r\n"), Some(1));
    assert_eq!(status(Opcode::Delete, b"HD\r\n"), Some(0));
    assert_eq!(status(Opcode::DeleteQ, b"HD\r\n"), None);
    assert_eq!(status(Opcode::DeleteQ, b"NF\r\n"), Some(1));
    assert_eq!(
        status(Opcode::Set, b"SERVER_ERROR object too large for cache\r\n"),
        Some(3)
    );
    assert_eq!(
        status(
            Opcode::Append,
            b"SERVER_ERROR object too large for cache\r\n"
        ),
        Some(5)
    );
    assert_eq!(
        status(
            Opcode::Set,
            b"SERVER_ERROR out of memory storing object\r\n"
        ),
        Some(0x82)
    );
    assert_eq!(
        status(
            Opcode::Set,
            b"SERVER_ERROR cluster: no master available for this key, retry\r\n"
        ),
        Some(0x86)
    );
}

#[test]
fn counters_reply_with_eight_bytes() {
    let r = one(&shape(Opcode::Increment).reply(b"VA 2 c8\r\n42\r\n"));
    assert_eq!((r.1, r.3, r.6), (0, 8, 42u64.to_be_bytes().to_vec()));
    assert!(
        shape(Opcode::IncrementQ)
            .reply(b"VA 2 c8\r\n42\r\n")
            .is_empty()
    );
    let r = one(&shape(Opcode::Decrement)
        .reply(b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n"));
    assert_eq!(r.1, Status::NonNumeric.code());
    assert_eq!(one(&shape(Opcode::Increment).reply(b"NF\r\n")).1, 1);
    assert_eq!(one(&shape(Opcode::Increment).reply(b"EX\r\n")).1, 2);
}

#[test]
fn stats_are_one_packet_each_then_an_empty_one() {
    let all =
        responses(&shape(Opcode::Stat).reply(b"STAT pid 12\r\nSTAT version 1.0 x\r\nEND\r\n"));
    let kv: Vec<(Vec<u8>, Vec<u8>)> = all.iter().map(|r| (r.5.clone(), r.6.clone())).collect();
    assert_eq!(
        kv,
        vec![
            (b"pid".to_vec(), b"12".to_vec()),
            (b"version".to_vec(), b"1.0 x".to_vec()),
            (vec![], vec![])
        ]
    );
    assert!(
        all.iter()
            .all(|r| r.0 == 0x10 && r.1 == 0 && r.2 == 0xa1b2_c3d4)
    );
    assert_eq!(one(&shape(Opcode::Stat).reply(b"RESET\r\n")).5.len(), 0);
    assert_eq!(one(&shape(Opcode::Stat).reply(b"ERROR\r\n")).1, 1);
}

#[test]
fn keyless_replies() {
    assert_eq!(one(&shape(Opcode::Noop).reply(b"MN\r\n")).1, 0);
    assert_eq!(
        one(&shape(Opcode::Version).reply(b"VERSION 1.2.3\r\n")).6,
        b"1.2.3"
    );
    assert_eq!(one(&shape(Opcode::Flush).reply(b"OK\r\n")).1, 0);
    assert!(shape(Opcode::FlushQ).reply(b"OK\r\n").is_empty());
    assert_eq!(one(&shape(Opcode::Quit).reply(b"")).1, 0);
    assert!(shape(Opcode::QuitQ).reply(b"").is_empty());
    // Anything unexpected is an internal error, never silence.
    let r = one(&shape(Opcode::Noop).reply(b"garbage\r\n"));
    assert_eq!(r.1, Status::InternalError.code());
}
