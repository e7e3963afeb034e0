//! Candidate node names as kube-scheduler sends them, kept in one buffer: thousands of
//! names per call cost two allocations instead of one each, answers refer to them by
//! position, and an unchanged list is recognised by one comparison of the buffers.

use std::fmt;

/// Node names in the order given.
#[derive(Default, PartialEq, Eq)]
pub struct Names {
    text: String,
    /// Where each name ends in `text`.
    ends: Vec<u32>,
    /// Some name holds a character JSON must escape (`"`, `\\`, a control character):
    /// without one, the answer copies names as they are.
    escapes: bool,
}

/// JSON's whitespace between tokens.
fn json_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

/// The position of the first byte from `i` on that is not JSON whitespace.
pub(super) fn skip_space(bytes: &[u8], mut i: usize) -> usize {
    while bytes.get(i).is_some_and(|&b| json_space(b)) {
        i += 1;
    }
    i
}

/// Whether JSON must escape a character of `s`.
pub(super) fn needs_escape(s: &str) -> bool {
    s.bytes().any(|b| b == b'"' || b == b'\\' || b < 0x20)
}

impl Clone for Names {
    fn clone(&self) -> Names {
        Names {
            text: self.text.clone(),
            ends: self.ends.clone(),
            escapes: self.escapes,
        }
    }

    /// Copies into the buffers already held (the extender keeps the previous call's list
    /// this way without allocating anew each call).
    fn clone_from(&mut self, source: &Names) {
        self.text.clone_from(&source.text);
        self.ends.clone_from(&source.ends);
        self.escapes = source.escapes;
    }
}

impl fmt::Debug for Names {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl Names {
    pub fn with_capacity(names: usize, bytes: usize) -> Names {
        Names {
            text: String::with_capacity(bytes),
            ends: Vec::with_capacity(names),
            escapes: false,
        }
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Adds a name at the end; `false` (nothing added) when the buffer would pass 4 GiB.
    pub fn push(&mut self, name: &str) -> bool {
        let pushed = self.push_plain(name);
        self.escapes |= pushed && needs_escape(name);
        pushed
    }

    /// [`Names::push`] of a name known to need no escape.
    fn push_plain(&mut self, name: &str) -> bool {
        let Ok(end) = u32::try_from(self.text.len() + name.len()) else {
            return false;
        };
        self.text.push_str(name);
        self.ends.push(end);
        true
    }

    /// Whether some name needs escaping in JSON.
    pub fn escapes(&self) -> bool {
        self.escapes
    }

    /// The `i`th name ("" past the end).
    pub fn get(&self, i: usize) -> &str {
        let Some(&end) = self.ends.get(i) else {
            return "";
        };
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        self.text.get(start as usize..end as usize).unwrap_or("")
    }

    pub fn iter(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        (0..self.len()).map(|i| self.get(i))
    }

    /// The `i`th name's bytes (none past the end): for writing answers.
    pub(super) fn bytes(&self, i: usize) -> &[u8] {
        let start = match i.checked_sub(1) {
            Some(before) => self.ends.get(before).copied().unwrap_or(0),
            None => 0,
        };
        let end = self.ends.get(i).copied().unwrap_or(start);
        self.text
            .as_bytes()
            .get(start as usize..end as usize)
            .unwrap_or_default()
    }

    /// Every name's bytes, in order (one walk, no lookups).
    pub(super) fn each_bytes(&self) -> impl ExactSizeIterator<Item = &[u8]> + '_ {
        let text = self.text.as_bytes();
        let mut start = 0usize;
        self.ends.iter().map(move |&end| {
            let name = text.get(start..end as usize).unwrap_or_default();
            start = end as usize;
            name
        })
    }

    /// The names at positions `at`, in that order (`None`: a position past the end).
    pub(super) fn picked(&self, at: &[u32]) -> Option<Names> {
        let mut out = Names::with_capacity(
            at.len(),
            at.len() * (self.text.len() / self.len().max(1) + 1),
        );
        for &i in at {
            let i = i as usize;
            let name = self.get(i);
            if i >= self.len() || !out.push_plain(name) {
                return None;
            }
            // Only a list with escapes can give one.
            out.escapes |= self.escapes && needs_escape(name);
        }
        Some(out)
    }

    /// Calls `at` with the position in `within` of each name, in order, each past the one
    /// before; `None` (after some calls) when the names are not a subsequence of `within`.
    /// One walk over both buffers (a few ns per name, where string slices with their checks
    /// took ~15).
    pub(super) fn positions_in(&self, within: &Names, mut at: impl FnMut(usize)) -> Option<()> {
        let (text, other) = (self.text.as_bytes(), within.text.as_bytes());
        let (mut start, mut j, mut other_start) = (0usize, 0usize, 0usize);
        for &end in &self.ends {
            let name = text.get(start..end as usize)?;
            start = end as usize;
            loop {
                let other_end = *within.ends.get(j)? as usize;
                let candidate = other.get(other_start..other_end)?;
                other_start = other_end;
                j += 1;
                if candidate == name {
                    at(j - 1);
                    break;
                }
            }
        }
        Some(())
    }
}

impl Names {
    /// Reads a JSON list of names (`text`, as the request carries it). The common case,
    /// names without escapes, is read by one pass over the bytes; anything else (escapes,
    /// and every malformed list, so that the error names the problem) goes through
    /// serde_json. Measured: serde_json alone took ~47 ns per name at 5,000 names.
    pub fn parse_json(text: &str) -> Result<Names, serde_json::Error> {
        match Names::scan(text) {
            Some(names) => Ok(names),
            None => serde_json::from_str(text),
        }
    }

    /// `[ "a" , "b" ]` with plain strings (no escape, no control character), else `None`.
    fn scan(text: &str) -> Option<Names> {
        let (names, used) = Names::scan_prefix(text)?;
        let rest = text.get(used..)?;
        rest.bytes().all(json_space).then_some(names)
    }

    /// A list as [`Names::scan`] reads it at the start of `text` (after optional
    /// whitespace), and the bytes it took up to its `]`; `None` for anything else.
    pub(super) fn scan_prefix(text: &str) -> Option<(Names, usize)> {
        let bytes = text.as_bytes();
        let skip = |i: usize| skip_space(bytes, i);
        let mut i = skip(0);
        if bytes.get(i) != Some(&b'[') {
            return None;
        }
        // Sized for the rest of the text (the whole list, when it is all of it).
        let mut names = Names::with_capacity(bytes.len() / 12, bytes.len());
        i = skip(i + 1);
        if bytes.get(i) == Some(&b']') {
            return Some((names, i + 1));
        }
        loop {
            if bytes.get(i) != Some(&b'"') {
                return None;
            }
            let start = i + 1;
            let len = bytes
                .get(start..)?
                .iter()
                .position(|&b| b == b'"' || b == b'\\' || b < 0x20)?;
            let end = start + len;
            if bytes[end] != b'"' {
                return None;
            }
            // Between two ASCII quotes of a str: on character boundaries.
            let name = text.get(start..end)?;
            if !names.push_plain(name) {
                return None;
            }
            i = skip(end + 1);
            match bytes.get(i) {
                Some(b',') => i = skip(i + 1),
                Some(b']') => return Some((names, i + 1)),
                _ => return None,
            }
        }
    }
}

impl<'a> FromIterator<&'a str> for Names {
    fn from_iter<I: IntoIterator<Item = &'a str>>(iter: I) -> Names {
        let mut names = Names::default();
        for name in iter {
            names.push(name);
        }
        names
    }
}

impl serde::Serialize for Names {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter())
    }
}

/// A JSON array of strings, each appended to the buffer as it is read (borrowed from the
/// body when it has no escapes: no allocation per name).
impl<'de> serde::Deserialize<'de> for Names {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Names, D::Error> {
        struct List;
        impl<'de> serde::de::Visitor<'de> for List {
            type Value = Names;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list of node names")
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Names, A::Error> {
                let count = seq.size_hint().unwrap_or(0).min(1 << 16);
                let mut names = Names::with_capacity(count, count * 16);
                while seq.next_element_seed(Name(&mut names))?.is_some() {}
                Ok(names)
            }
        }
        d.deserialize_seq(List)
    }
}

/// One name of the list, appended to the buffer.
struct Name<'n>(&'n mut Names);

impl<'de> serde::de::DeserializeSeed<'de> for Name<'_> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_str(self)
    }
}

impl serde::de::Visitor<'_> for Name<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a node name (a string)")
    }

    fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<(), E> {
        if self.0.push(name) {
            Ok(())
        } else {
            Err(E::custom("the node names pass 4 GiB"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_refuse_what_is_not_a_name() {
        let names: Names = serde_json::from_str(r#"["n1", "", "n\u00e9\"3"]"#).unwrap();
        assert_eq!(names.len(), 3);
        assert_eq!(names.iter().collect::<Vec<_>>(), ["n1", "", "né\"3"]);
        assert_eq!(names.get(7), "");
        assert_eq!(names.bytes(2), "né\"3".as_bytes());
        assert_eq!(names.bytes(1), b"");
        assert_eq!(names.bytes(7), b"");
        let each: Vec<&[u8]> = names.each_bytes().collect();
        assert_eq!(each, names.iter().map(str::as_bytes).collect::<Vec<_>>());
        assert_eq!(
            serde_json::to_string(&names).unwrap(),
            r#"["n1","","né\"3"]"#
        );
        let same: Names = ["n1", "", "né\"3"].into_iter().collect();
        assert_eq!(same, names);
        for bad in [r#"["n1", null]"#, r#"["n1", 3]"#, r#""n1""#, r#"{"a": 1}"#] {
            let e = serde_json::from_str::<Names>(bad).unwrap_err().to_string();
            assert!(
                e.contains("node name") || e.contains("list of node names"),
                "{bad}: {e}"
            );
            assert!(Names::parse_json(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn positions_in_a_longer_list_follow_its_order() {
        let all: Names = ["a", "bb", "", "c", "bb"].into_iter().collect();
        let some = |l: &[&str]| {
            let mut found = Vec::new();
            let names = l.iter().copied().collect::<Names>();
            names.positions_in(&all, |j| found.push(j)).map(|()| found)
        };
        assert_eq!(some(&["a", "bb", "", "c", "bb"]), Some(vec![0, 1, 2, 3, 4]));
        assert_eq!(some(&["bb", "c", "bb"]), Some(vec![1, 3, 4]));
        assert_eq!(some(&["", "bb"]), Some(vec![2, 4]));
        assert_eq!(some(&[]), Some(vec![]));
        assert_eq!(some(&["c", "a"]), None);
        assert_eq!(some(&["b"]), None);
        assert_eq!(some(&["bb", "bb", "bb"]), None);
        assert_eq!(some(&["a", "bb", "", "c", "bb", "a"]), None);
    }

    /// The one-pass reader agrees with serde_json on every list it reads, and leaves every
    /// other (escapes, malformed) to serde_json.
    #[test]
    fn the_quick_reader_agrees_with_serde_json() {
        let cases = [
            "[]",
            " [ ] ",
            r#"["a"]"#,
            "[\"a\" ,\n \"b\"\t]",
            r#"["", "n-1", "né"]"#,
            r#"["a\"b", "c"]"#,
            r#"["a\u0041"]"#,
            "[\"a\u{1}\"]",
            r#"["a",]"#,
            r#"["a" "b"]"#,
            r#"["a"] x"#,
            r#"["a""#,
            r#"["a", 1]"#,
            "[",
            "",
            r#"[,"a"]"#,
        ];
        for text in cases {
            let slow = serde_json::from_str::<Names>(text).ok();
            if let Some(quick) = Names::scan(text) {
                assert_eq!(Some(quick), slow, "{text:?}");
            }
            assert_eq!(Names::parse_json(text).ok(), slow, "{text:?}");
        }
        assert!(Names::scan(r#"["a\"b"]"#).is_none());
        assert!(Names::scan(r#"["a", "b"]"#).is_some());
    }
}
