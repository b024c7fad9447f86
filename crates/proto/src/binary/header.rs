//! The fixed 24-byte header both directions share, the opcodes and the status codes.
//!
//! All integers are big-endian on the wire. A request's bytes 6–7 are a vbucket id (unused
//! by memcached and cellcache); a response's are its status.

/// Length of every packet header.
pub const HEADER_BYTES: usize = 24;
/// First byte of every request (and how a connection is recognised as binary).
pub const MAGIC_REQUEST: u8 = 0x80;
/// First byte of every response.
pub const MAGIC_RESPONSE: u8 = 0x81;

/// A packet header, fields in host order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Header {
    /// [`MAGIC_REQUEST`] or [`MAGIC_RESPONSE`].
    pub magic: u8,
    /// The command (see [`Opcode`]); a response echoes its request's.
    pub opcode: u8,
    /// Key length in bytes.
    pub key_len: u16,
    /// Extras length in bytes.
    pub extras_len: u8,
    /// Data type (always 0, raw bytes).
    pub data_type: u8,
    /// Vbucket id in a request, status code in a response.
    pub vbucket_or_status: u16,
    /// Extras + key + value, in bytes.
    pub body_len: u32,
    /// Copied from request to response untouched.
    pub opaque: u32,
    /// Data version check (CAS).
    pub cas: u64,
}

impl Header {
    /// Reads a header from the first [`HEADER_BYTES`] of `buf`; `None` if `buf` is shorter.
    pub fn decode(buf: &[u8]) -> Option<Header> {
        let b: &[u8; HEADER_BYTES] = buf.get(..HEADER_BYTES)?.try_into().ok()?;
        Some(Header {
            magic: b[0],
            opcode: b[1],
            key_len: u16::from_be_bytes([b[2], b[3]]),
            extras_len: b[4],
            data_type: b[5],
            vbucket_or_status: u16::from_be_bytes([b[6], b[7]]),
            body_len: u32::from_be_bytes([b[8], b[9], b[10], b[11]]),
            opaque: u32::from_be_bytes([b[12], b[13], b[14], b[15]]),
            cas: u64::from_be_bytes([b[16], b[17], b[18], b[19], b[20], b[21], b[22], b[23]]),
        })
    }

    /// Appends the header's 24 bytes.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(self.magic);
        out.push(self.opcode);
        out.extend_from_slice(&self.key_len.to_be_bytes());
        out.push(self.extras_len);
        out.push(self.data_type);
        out.extend_from_slice(&self.vbucket_or_status.to_be_bytes());
        out.extend_from_slice(&self.body_len.to_be_bytes());
        out.extend_from_slice(&self.opaque.to_be_bytes());
        out.extend_from_slice(&self.cas.to_be_bytes());
    }
}

macro_rules! opcodes {
    ($($(#[$doc:meta])* $name:ident = $code:literal,)*) => {
        /// The commands cellcache serves (memcached's `protocol_binary_command`, less the
        /// never-implemented range/multiply commands).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Opcode {
            $($(#[$doc])* $name = $code,)*
        }

        impl Opcode {
            /// Every opcode, in code order.
            pub const ALL: &'static [Opcode] = &[$(Opcode::$name,)*];

            /// The opcode for a wire byte, `None` if cellcache does not serve it.
            pub const fn from_code(code: u8) -> Option<Opcode> {
                match code {
                    $($code => Some(Opcode::$name),)*
                    _ => None,
                }
            }
        }
    };
}

opcodes! {
    /// Get a value.
    Get = 0x00,
    /// Store unconditionally.
    Set = 0x01,
    /// Store if absent.
    Add = 0x02,
    /// Store if present.
    Replace = 0x03,
    /// Remove an item.
    Delete = 0x04,
    /// Add to a counter (creating it unless the expiration is `0xffffffff`).
    Increment = 0x05,
    /// Subtract from a counter, stopping at 0.
    Decrement = 0x06,
    /// Answer, then close.
    Quit = 0x07,
    /// Invalidate every item, now or after a delay.
    Flush = 0x08,
    /// Quiet get: a miss sends nothing.
    GetQ = 0x09,
    /// No operation; its reply marks the end of a pipeline of quiet commands.
    Noop = 0x0a,
    /// The server's version string.
    Version = 0x0b,
    /// Get, with the key in the reply.
    GetK = 0x0c,
    /// Quiet get with the key.
    GetKQ = 0x0d,
    /// Add bytes after a value.
    Append = 0x0e,
    /// Add bytes before a value.
    Prepend = 0x0f,
    /// Statistics, one packet per stat, ended by an empty one.
    Stat = 0x10,
    /// Quiet set.
    SetQ = 0x11,
    /// Quiet add.
    AddQ = 0x12,
    /// Quiet replace.
    ReplaceQ = 0x13,
    /// Quiet delete.
    DeleteQ = 0x14,
    /// Quiet increment.
    IncrementQ = 0x15,
    /// Quiet decrement.
    DecrementQ = 0x16,
    /// Close without a reply.
    QuitQ = 0x17,
    /// Quiet flush.
    FlushQ = 0x18,
    /// Quiet append.
    AppendQ = 0x19,
    /// Quiet prepend.
    PrependQ = 0x1a,
    /// Set the log verbosity (accepted and ignored).
    Verbosity = 0x1b,
    /// Change an item's expiration.
    Touch = 0x1c,
    /// Get and touch.
    Gat = 0x1d,
    /// Quiet get and touch.
    GatQ = 0x1e,
    /// The SASL mechanisms the server offers (a space-separated list as the value).
    SaslListMechs = 0x20,
    /// Start a SASL authentication: the mechanism is the key, the client's first response
    /// the value.
    SaslAuth = 0x21,
    /// Continue a SASL authentication the server answered "continue".
    SaslStep = 0x22,
    /// Get and touch, with the key in the reply.
    GatK = 0x23,
    /// Quiet get and touch with the key.
    GatKQ = 0x24,
}

impl Opcode {
    /// The wire byte.
    pub const fn code(self) -> u8 {
        self as u8
    }

    /// A storage command (set, add, replace, append, prepend and their quiet forms): the
    /// frames that carry a value.
    pub const fn is_storage(self) -> bool {
        use Opcode as O;
        matches!(
            self,
            O::Set
                | O::SetQ
                | O::Add
                | O::AddQ
                | O::Replace
                | O::ReplaceQ
                | O::Append
                | O::AppendQ
                | O::Prepend
                | O::PrependQ
        )
    }

    /// A quiet command: its success reply is not sent (and for the get family, its miss).
    pub const fn is_quiet(self) -> bool {
        use Opcode as O;
        matches!(
            self,
            O::GetQ
                | O::GetKQ
                | O::SetQ
                | O::AddQ
                | O::ReplaceQ
                | O::DeleteQ
                | O::IncrementQ
                | O::DecrementQ
                | O::QuitQ
                | O::FlushQ
                | O::AppendQ
                | O::PrependQ
                | O::GatQ
                | O::GatKQ
        )
    }

    /// A get whose reply carries the key (`GETK`, `GETKQ`, `GATK`, `GATKQ`).
    pub const fn returns_key(self) -> bool {
        matches!(
            self,
            Opcode::GetK | Opcode::GetKQ | Opcode::GatK | Opcode::GatKQ
        )
    }
}

macro_rules! statuses {
    ($($(#[$doc:meta])* $name:ident = $code:literal => $message:literal,)*) => {
        /// Response status codes (memcached's `protocol_binary_response_status`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Status {
            $($(#[$doc])* $name = $code,)*
        }

        impl Status {
            /// Every status, in code order.
            pub const ALL: &'static [Status] = &[$(Status::$name,)*];

            /// The status for a wire code, `None` if unknown.
            pub const fn from_code(code: u16) -> Option<Status> {
                match code {
                    $($code => Some(Status::$name),)*
                    _ => None,
                }
            }

            /// The text memcached puts in the body of an error response with this status
            /// (empty for success, and for "continue", whose body is a SASL challenge).
            pub const fn message(self) -> &'static str {
                match self {
                    $(Status::$name => $message,)*
                }
            }
        }
    };
}

statuses! {
    /// Success.
    NoError = 0x0000 => "",
    /// The key does not exist (or a CAS operation found no item).
    KeyNotFound = 0x0001 => "Not found",
    /// The key exists (`add`), or its CAS differs.
    KeyExists = 0x0002 => "Data exists for key.",
    /// The value is larger than `item_size_max`.
    ValueTooLarge = 0x0003 => "Too large.",
    /// Malformed request (the connection is then closed).
    InvalidArguments = 0x0004 => "Invalid arguments",
    /// `append`/`prepend` to a missing item, or a lost race to create a counter.
    ItemNotStored = 0x0005 => "Not stored.",
    /// `incr`/`decr` of a value that is not a decimal number.
    NonNumeric = 0x0006 => "Non-numeric server-side value for incr or decr",
    /// Authentication failed, or a command before authentication (memcached closes the
    /// connection after the latter).
    AuthError = 0x0020 => "Auth failure.",
    /// SASL: the mechanism needs another step (`SaslStep`); the value is the server's
    /// challenge (empty for PLAIN).
    AuthContinue = 0x0021 => "",
    /// Unknown opcode.
    UnknownCommand = 0x0081 => "Unknown command",
    /// The store has no memory for the item.
    OutOfMemory = 0x0082 => "Out of memory",
    /// An internal failure.
    InternalError = 0x0084 => "Internal error",
    /// A retryable failure (cellcache: no master reachable for the key, or not in a ring yet).
    TemporaryFailure = 0x0086 => "Temporary failure",
}

impl Status {
    /// The wire code.
    pub const fn code(self) -> u16 {
        self as u16
    }
}
