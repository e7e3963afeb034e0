//! The kubelet's plugin watcher dials a registration socket by its bare path, so grpc-go
//! sends that path as the HTTP/2 `:authority`
//! (`/var/lib/kubelet/plugins_registry/<driver>-reg.sock`), which h2, tonic's HTTP/2, refuses
//! as malformed: the kubelet sees `RST_STREAM ... PROTOCOL_ERROR` and never registers the
//! driver (seen on the real 1.36 kubelet; kubernetes/kubernetes#108254 and #109081). The
//! kubelet's own calls to the plugin socket dial `unix:<path>` and send `localhost`.
//!
//! So the registration socket's bytes from the kubelet pass through [`Rewriter`] first: in
//! every header block, a literal `:authority` field (by its static-table name) gets the
//! value `localhost`; everything else is copied as it came. The HPACK state stays
//! consistent: the rewritten field keeps its representation, so an entry the kubelet adds
//! to the dynamic table is added on our side too (with the new value), at the same index,
//! and a later reference to it reads `localhost`.

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The HTTP/2 client connection preface.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER: usize = 9;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The frame size every HTTP/2 peer accepts (SETTINGS_MAX_FRAME_SIZE's floor).
const MAX_FRAME: usize = 16_384;
/// A header block larger than this is refused (the kubelet's are a few hundred bytes).
const MAX_BLOCK: usize = 256 * 1024;
/// HPACK static table index of `:authority`.
const AUTHORITY_INDEX: u64 = 1;
const LOCALHOST: &[u8] = b"localhost";

#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum RewriteError {
    #[error("not an HTTP/2 connection (no client preface)")]
    NoPreface,
    #[error("header block of {0} bytes is over {MAX_BLOCK}")]
    TooLarge(usize),
    #[error("malformed frame: {0}")]
    Malformed(&'static str),
}

/// Rewrites the `:authority` of every header block in a client-to-server HTTP/2 byte stream.
#[derive(Default)]
pub struct Rewriter {
    input: Vec<u8>,
    preface_seen: bool,
    /// A header block begun by HEADERS and not yet ended: (HEADERS frame header, priority
    /// bytes, the block so far).
    open: Option<OpenBlock>,
}

struct OpenBlock {
    flags: u8,
    stream: [u8; 4],
    priority: Vec<u8>,
    block: Vec<u8>,
}

impl Rewriter {
    /// Takes bytes as they arrive; appends to `out` every byte that can be passed on.
    pub fn feed(&mut self, bytes: &[u8], out: &mut Vec<u8>) -> Result<(), RewriteError> {
        self.input.extend_from_slice(bytes);
        if !self.preface_seen {
            if self.input.len() < PREFACE.len() {
                return if PREFACE.starts_with(&self.input) {
                    Ok(())
                } else {
                    Err(RewriteError::NoPreface)
                };
            }
            if !self.input.starts_with(PREFACE) {
                return Err(RewriteError::NoPreface);
            }
            out.extend_from_slice(PREFACE);
            self.input.drain(..PREFACE.len());
            self.preface_seen = true;
        }
        while self.input.len() >= FRAME_HEADER {
            let length = usize::from(self.input[0]) << 16
                | usize::from(self.input[1]) << 8
                | usize::from(self.input[2]);
            if length > MAX_BLOCK {
                return Err(RewriteError::TooLarge(length));
            }
            if self.input.len() < FRAME_HEADER + length {
                return Ok(());
            }
            let frame: Vec<u8> = self.input.drain(..FRAME_HEADER + length).collect();
            self.frame(&frame, out)?;
        }
        Ok(())
    }

    fn frame(&mut self, frame: &[u8], out: &mut Vec<u8>) -> Result<(), RewriteError> {
        let (kind, flags) = (frame[3], frame[4]);
        let stream: [u8; 4] = [frame[5], frame[6], frame[7], frame[8]];
        let payload = &frame[FRAME_HEADER..];
        match kind {
            HEADERS => {
                let (priority, fragment) = split_headers(flags, payload)?;
                self.open = Some(OpenBlock {
                    flags,
                    stream,
                    priority: priority.to_vec(),
                    block: fragment.to_vec(),
                });
            }
            CONTINUATION if self.open.is_some() => {
                if let Some(open) = self.open.as_mut() {
                    open.block.extend_from_slice(payload);
                    if open.block.len() > MAX_BLOCK {
                        return Err(RewriteError::TooLarge(open.block.len()));
                    }
                }
            }
            _ => {
                out.extend_from_slice(frame);
                return Ok(());
            }
        }
        if flags & END_HEADERS != 0
            && let Some(open) = self.open.take()
        {
            let block = rewrite_block(&open.block)?;
            emit_headers(&open, &block, out);
        }
        Ok(())
    }
}

/// The priority bytes and the header block fragment of a HEADERS payload (padding dropped).
fn split_headers(flags: u8, payload: &[u8]) -> Result<(&[u8], &[u8]), RewriteError> {
    let mut body = payload;
    let mut pad = 0usize;
    if flags & PADDED != 0 {
        let (&n, rest) = body.split_first().ok_or(RewriteError::Malformed(
            "PADDED HEADERS without a pad length",
        ))?;
        pad = usize::from(n);
        body = rest;
    }
    let priority_len = if flags & PRIORITY != 0 { 5 } else { 0 };
    if body.len() < priority_len + pad {
        return Err(RewriteError::Malformed("HEADERS shorter than its padding"));
    }
    let (priority, rest) = body.split_at(priority_len);
    Ok((priority, &rest[..rest.len() - pad]))
}

/// HEADERS (+ CONTINUATION) frames for a rewritten block: no padding, END_HEADERS on the
/// last frame, END_STREAM and PRIORITY as the kubelet sent them.
fn emit_headers(open: &OpenBlock, block: &[u8], out: &mut Vec<u8>) {
    let keep = open.flags & !(PADDED | END_HEADERS);
    let first_room = MAX_FRAME - open.priority.len();
    let (first, mut rest) = block.split_at(block.len().min(first_room));
    let end = if rest.is_empty() { END_HEADERS } else { 0 };
    let mut payload = open.priority.clone();
    payload.extend_from_slice(first);
    push_frame(out, HEADERS, keep | end, open.stream, &payload);
    while !rest.is_empty() {
        let (chunk, tail) = rest.split_at(rest.len().min(MAX_FRAME));
        let end = if tail.is_empty() { END_HEADERS } else { 0 };
        push_frame(out, CONTINUATION, end, open.stream, chunk);
        rest = tail;
    }
}

fn push_frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: [u8; 4], payload: &[u8]) {
    let n = payload.len();
    out.extend_from_slice(&[(n >> 16) as u8, (n >> 8) as u8, n as u8, kind, flags]);
    out.extend_from_slice(&stream);
    out.extend_from_slice(payload);
}

/// An HPACK integer with an `n`-bit prefix at `block[at]`: (value, bytes used).
fn integer(block: &[u8], at: usize, n: u32) -> Result<(u64, usize), RewriteError> {
    let truncated = RewriteError::Malformed("truncated HPACK integer");
    let mask = (1u16 << n) - 1;
    let first = u64::from(*block.get(at).ok_or(truncated.clone())? & mask as u8);
    if first < u64::from(mask) {
        return Ok((first, 1));
    }
    let (mut value, mut shift, mut used) = (first, 0u32, 1usize);
    loop {
        let b = *block.get(at + used).ok_or(truncated.clone())?;
        used += 1;
        if shift > 56 {
            return Err(RewriteError::Malformed("HPACK integer too large"));
        }
        value += u64::from(b & 0x7f) << shift;
        shift += 7;
        if b & 0x80 == 0 {
            return Ok((value, used));
        }
    }
}

/// The bytes an HPACK string literal at `at` takes (length prefix and data).
fn string_len(block: &[u8], at: usize) -> Result<usize, RewriteError> {
    let (len, used) = integer(block, at, 7)?;
    let total = used
        .checked_add(usize::try_from(len).unwrap_or(usize::MAX))
        .ok_or(RewriteError::Malformed("HPACK string too long"))?;
    if at + total > block.len() {
        return Err(RewriteError::Malformed("truncated HPACK string"));
    }
    Ok(total)
}

/// The header block with every literal `:authority` value replaced by `localhost`.
pub fn rewrite_block(block: &[u8]) -> Result<Vec<u8>, RewriteError> {
    let mut out = Vec::with_capacity(block.len());
    let mut at = 0;
    while at < block.len() {
        let b = block[at];
        let (prefix_bits, literal) = match b {
            _ if b & 0x80 != 0 => (7, false),    // indexed field
            _ if b & 0xc0 == 0x40 => (6, true),  // literal, incremental indexing
            _ if b & 0xe0 == 0x20 => (5, false), // dynamic table size update
            _ => (4, true),                      // literal, without / never indexed
        };
        let (index, used) = integer(block, at, prefix_bits)?;
        if !literal {
            out.extend_from_slice(&block[at..at + used]);
            at += used;
            continue;
        }
        let name_len = if index == 0 {
            string_len(block, at + used)?
        } else {
            0
        };
        let value_at = at + used + name_len;
        let value_len = string_len(block, value_at)?;
        out.extend_from_slice(&block[at..value_at]);
        if index == AUTHORITY_INDEX {
            out.push(LOCALHOST.len() as u8);
            out.extend_from_slice(LOCALHOST);
        } else {
            out.extend_from_slice(&block[value_at..value_at + value_len]);
        }
        at = value_at + value_len;
    }
    Ok(out)
}

/// Serves one accepted registration connection through the rewriter: returns the end tonic
/// serves; the copying ends when either side closes.
pub fn proxied(conn: tokio::net::UnixStream) -> tokio::io::DuplexStream {
    let (ours, theirs) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        let (mut client_read, mut client_write) = conn.into_split();
        let (mut server_read, mut server_write) = tokio::io::split(ours);
        let inbound = async {
            let mut rewriter = Rewriter::default();
            let mut buf = vec![0u8; 16 * 1024];
            let mut out = Vec::new();
            loop {
                let n = client_read.read(&mut buf).await?;
                if n == 0 {
                    return server_write.shutdown().await;
                }
                out.clear();
                rewriter
                    .feed(&buf[..n], &mut out)
                    .map_err(std::io::Error::other)?;
                server_write.write_all(&out).await?;
            }
        };
        let outbound = tokio::io::copy(&mut server_read, &mut client_write);
        // Either direction ending closes the connection.
        let _ = tokio::select! {
            r = inbound => r.map(|_| 0),
            r = outbound => r,
        };
    });
    theirs
}

#[cfg(test)]
mod tests;
