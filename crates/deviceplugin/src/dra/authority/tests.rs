use super::*;

/// A literal with incremental indexing, name by static index, raw (not Huffman) value.
fn literal_indexed(index: u8, value: &[u8]) -> Vec<u8> {
    let mut b = vec![0x40 | index, value.len() as u8];
    b.extend_from_slice(value);
    b
}

const PATH: &[u8] = b"/var/lib/kubelet/plugins_registry/gpu.gpuplace.io-reg.sock";

fn block() -> Vec<u8> {
    let mut b = vec![0x83, 0x86]; // :method POST, :scheme http (static, indexed)
    b.extend(literal_indexed(AUTHORITY_INDEX as u8, PATH));
    // :path without indexing (0000 + index 4), raw value
    let path = b"/pluginregistration.Registration/GetInfo";
    b.push(0x04);
    b.push(path.len() as u8);
    b.extend_from_slice(path);
    b.push(0x20); // a dynamic table size update to 0
    b
}

#[test]
fn the_authority_literal_becomes_localhost_and_the_rest_is_kept() {
    let rewritten = rewrite_block(&block()).expect("rewritten");
    let mut want = vec![0x83, 0x86];
    want.extend(literal_indexed(AUTHORITY_INDEX as u8, LOCALHOST));
    want.extend_from_slice(&block()[2 + 2 + PATH.len()..]);
    assert_eq!(rewritten, want);
    // A Huffman value (H bit set) is replaced as well; an indexed reference is untouched.
    let huffman = [0x41, 0x83, 0xaa, 0xbb, 0xcc, 0xbe];
    let mut want = literal_indexed(1, LOCALHOST);
    want.push(0xbe);
    assert_eq!(rewrite_block(&huffman).expect("rewritten"), want);
    // Long integers (multi-byte prefixes) are read whole.
    let long_value = vec![b'x'; 300];
    let mut b = vec![0x40 | 2, 0x7f, (300 - 127) as u8 & 0x7f | 0x80, 0x01];
    b.extend_from_slice(&long_value);
    assert_eq!(rewrite_block(&b).expect("kept"), b);
    assert!(
        rewrite_block(&[0x41, 0x10, b'a']).is_err(),
        "truncated value"
    );
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    push_frame(&mut out, kind, flags, stream.to_be_bytes(), payload);
    out
}

#[test]
fn frames_are_rewritten_whatever_the_chunks_and_padding() {
    let mut input = PREFACE.to_vec();
    input.extend(frame(0x4, 0, 0, &[])); // SETTINGS
    // HEADERS, padded and with priority, split into a CONTINUATION.
    let b = block();
    let mut payload = vec![3u8]; // pad length
    payload.extend_from_slice(&[0, 0, 0, 0, 15]); // priority
    payload.extend_from_slice(&b[..10]);
    payload.extend_from_slice(&[0, 0, 0]);
    input.extend(frame(HEADERS, PADDED | PRIORITY, 1, &payload));
    input.extend(frame(CONTINUATION, END_HEADERS, 1, &b[10..]));
    input.extend(frame(0x0, 0x1, 1, &[0, 0, 0, 0, 0])); // DATA, END_STREAM
    let mut whole = Vec::new();
    Rewriter::default().feed(&input, &mut whole).expect("fed");
    let mut chunked = Vec::new();
    let mut r = Rewriter::default();
    for byte in &input {
        r.feed(std::slice::from_ref(byte), &mut chunked)
            .expect("fed");
    }
    assert_eq!(whole, chunked);
    let mut want = PREFACE.to_vec();
    want.extend(frame(0x4, 0, 0, &[]));
    let mut headers = vec![0, 0, 0, 0, 15];
    headers.extend(rewrite_block(&b).unwrap());
    want.extend(frame(HEADERS, PRIORITY | END_HEADERS, 1, &headers));
    want.extend(frame(0x0, 0x1, 1, &[0, 0, 0, 0, 0]));
    assert_eq!(whole, want);
    assert_eq!(
        Rewriter::default().feed(b"GET / HTTP/1.1\r\n\r\n", &mut Vec::new()),
        Err(RewriteError::NoPreface)
    );
}
