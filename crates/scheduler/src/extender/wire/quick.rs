//! `ExtenderArgs` read without serde_json's pass over the candidate names: the top-level
//! object is walked here, the Pod (and Nodes, and any other field) decoded by serde_json
//! where it stands, and `NodeNames` read by [`Names`]' one-pass reader straight from the
//! body. Measured at 5,000 names: serde_json took ~15 ns per name only to find where the
//! list ends, before the names were read. Anything this reader does not expect (a key with
//! escapes, a list with escapes, any malformed body) is left to the serde path, so that
//! errors still name the problem and every body decodes to the same arguments.

use std::sync::Mutex;

use k8s_openapi::api::core::v1::Pod;
use serde::de::DeserializeOwned;

use super::super::names::skip_space;
use super::args::{ExtenderArgs, NodeItems};
use super::recent::{self, Caller, Picked, RecentLists};
use crate::extender::names::Names;

/// The arguments, or `None` to leave the body to serde. With `lists`, the candidates' list
/// is taken from a kept one with the same bytes, and a filter's list is kept.
pub(super) fn args(
    body: &[u8],
    lists: Option<(&Mutex<RecentLists>, Caller)>,
) -> Option<ExtenderArgs> {
    let text = std::str::from_utf8(body).ok()?;
    let mut at = Cursor {
        text,
        i: 0,
        picked: None,
    };
    at.skip();
    at.expect(b'{')?;
    let (mut pod, mut nodes, mut names) = (None, None, None);
    loop {
        at.skip();
        let key = at.key()?;
        at.skip();
        at.expect(b':')?;
        at.skip();
        // Go matches field names case-insensitively; a later duplicate wins, as in serde.
        if key.eq_ignore_ascii_case("pod") {
            pod = at.value::<Option<Pod>>()?;
        } else if key.eq_ignore_ascii_case("nodes") {
            nodes = at.value::<Option<NodeItems>>()?.map(|l| l.items);
        } else if key.eq_ignore_ascii_case("nodenames") {
            names = at.names(lists)?;
        } else {
            at.value::<serde::de::IgnoredAny>()?;
        }
        at.skip();
        match at.next()? {
            b',' => continue,
            b'}' => break,
            _ => return None,
        }
    }
    at.skip();
    if at.i != text.len() {
        return None;
    }
    Some(ExtenderArgs {
        pod: pod?,
        nodes,
        node_names: names,
        picked: at.picked,
    })
}

struct Cursor<'a> {
    text: &'a str,
    i: usize,
    /// Where the last list read came from, when a filter answer passed it.
    picked: Option<Picked>,
}

impl<'a> Cursor<'a> {
    fn rest(&self) -> &'a str {
        self.text.get(self.i..).unwrap_or_default()
    }

    fn skip(&mut self) {
        self.i = skip_space(self.text.as_bytes(), self.i);
    }

    fn next(&mut self) -> Option<u8> {
        let b = *self.text.as_bytes().get(self.i)?;
        self.i += 1;
        Some(b)
    }

    fn expect(&mut self, want: u8) -> Option<()> {
        (self.next()? == want).then_some(())
    }

    /// A key without escapes or control characters.
    fn key(&mut self) -> Option<&'a str> {
        self.expect(b'"')?;
        let start = self.i;
        let len = self.rest().bytes().position(|b| b == b'"')?;
        let key = self.text.get(start..start + len)?;
        if key.bytes().any(|b| b == b'\\' || b < 0x20) {
            return None;
        }
        self.i = start + len + 1;
        Some(key)
    }

    /// One value decoded by serde_json where it stands.
    fn value<T: DeserializeOwned>(&mut self) -> Option<T> {
        let mut stream = serde_json::Deserializer::from_str(self.rest()).into_iter::<T>();
        let value = stream.next()?.ok()?;
        self.i += stream.byte_offset();
        Some(value)
    }

    /// `null` or a list of plain names (or of any names, when a kept list has its bytes).
    fn names(&mut self, lists: Option<(&Mutex<RecentLists>, Caller)>) -> Option<Option<Names>> {
        let rest = self.rest();
        self.picked = None;
        if let Some(after) = rest.strip_prefix("null") {
            self.i = self.text.len() - after.len();
            return Some(None);
        }
        if let Some((lists, _)) = lists
            && let Some(found) = recent::lock(lists).find(rest.as_bytes())
        {
            self.i += found.used;
            self.picked = found.picked;
            return Some(Some(found.names));
        }
        let (names, used) = Names::scan_prefix(rest)?;
        if let Some((lists, Caller::Filter)) = lists {
            recent::lock(lists).read(rest.as_bytes().get(..used)?, &names);
        }
        self.i += used;
        Some(Some(names))
    }
}
