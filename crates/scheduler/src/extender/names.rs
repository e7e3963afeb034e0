//! Candidate node names as kube-scheduler sends them, kept in one buffer: thousands of
//! names per call cost two allocations instead of one each, answers refer to them by
//! position, and an unchanged list is recognised by one comparison of the buffers.

use std::fmt;

/// Node names in the order given.
#[derive(Default, PartialEq, Eq)]
pub struct Names {
    /// The names as the inside of a JSON list, `"a","b"`: each between quotes, commas
    /// between them. Without escapes (the usual case) a run of names is written to an
    /// answer by one copy. A name that needs escaping is kept as it is (then `escapes` is
    /// set and the text is not JSON).
    text: String,
    /// Where each name's closing quote is in `text`.
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

/// Where the name after the one whose closing quote is at `end` opens (past `",`).
fn next_open(end: u32) -> usize {
    end as usize + 2
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
    /// Room for `names` names taking `bytes` in all, with their quotes and commas.
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
        let comma = usize::from(!self.ends.is_empty());
        let Ok(end) = u32::try_from(self.text.len() + comma + 1 + name.len()) else {
            return false;
        };
        if comma == 1 {
            self.text.push(',');
        }
        self.text.push('"');
        self.text.push_str(name);
        self.text.push('"');
        self.ends.push(end);
        true
    }

    /// Whether some name needs escaping in JSON.
    pub fn escapes(&self) -> bool {
        self.escapes
    }

    /// Where the `i`th name opens (its quote) and closes (its closing quote).
    fn span(&self, i: usize) -> Option<(usize, usize)> {
        let end = *self.ends.get(i)? as usize;
        let open = match i.checked_sub(1) {
            Some(before) => next_open(*self.ends.get(before)?),
            None => 0,
        };
        Some((open, end))
    }

    /// The `i`th name ("" past the end).
    pub fn get(&self, i: usize) -> &str {
        self.span(i)
            .and_then(|(open, end)| self.text.get(open + 1..end))
            .unwrap_or("")
    }

    pub fn iter(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        (0..self.len()).map(|i| self.get(i))
    }

    /// The names `first..=last` as they stand in a JSON list (`"a","b"`); valid JSON only
    /// without escapes. Empty when a position is past the end or `last < first`.
    pub(super) fn json_run(&self, first: usize, last: usize) -> &[u8] {
        match (self.span(first), self.span(last)) {
            (Some((open, _)), Some((_, end))) if open <= end => {
                self.text.as_bytes().get(open..=end).unwrap_or_default()
            }
            _ => &[],
        }
    }

    /// Every name's bytes, in order (one walk, no lookups).
    pub(super) fn each_bytes(&self) -> impl ExactSizeIterator<Item = &[u8]> + '_ {
        let text = self.text.as_bytes();
        let mut open = 0usize;
        self.ends.iter().map(move |&end| {
            let name = text.get(open + 1..end as usize).unwrap_or_default();
            open = next_open(end);
            name
        })
    }

    /// The names at positions `at`, in that order (`None`: a position past the end). Runs
    /// of consecutive positions are copied whole.
    pub(super) fn picked(&self, at: &[u32]) -> Option<Names> {
        let mut out = Names::with_capacity(
            at.len(),
            at.len() * (self.text.len() / self.len().max(1) + 1),
        );
        for run in runs(at) {
            out.append_run(self, run.first, run.last)?;
        }
        Some(out)
    }

    /// Appends `source`'s names `first..=last`; `None` when a position is past its end or
    /// the buffer would pass 4 GiB.
    fn append_run(&mut self, source: &Names, first: usize, last: usize) -> Option<()> {
        let (open, _) = source.span(first)?;
        let run = source.text.get(open..=source.span(last)?.1)?;
        let ends = source.ends.get(first..=last)?;
        let comma = usize::from(!self.ends.is_empty());
        let at = self.text.len() + comma;
        // Each end moves from `open` in the source to `at` here.
        u32::try_from(at + run.len()).ok()?;
        if comma == 1 {
            self.text.push(',');
        }
        self.text.push_str(run);
        let shift = |end: u32| (end as usize - open + at) as u32;
        self.ends.extend(ends.iter().map(|&end| shift(end)));
        self.escapes |= source.escapes && run_escapes(ends, &source.text, open);
        Some(())
    }

    /// Calls `at` with the position in `within` of each name, in order, each past the one
    /// before; `None` (after some calls) when the names are not a subsequence of `within`.
    /// One walk over both buffers (a few ns per name, where string slices with their checks
    /// took ~15).
    pub(super) fn positions_in(&self, within: &Names, mut at: impl FnMut(usize)) -> Option<()> {
        let mut others = within.each_bytes().enumerate();
        for name in self.each_bytes() {
            loop {
                let (j, candidate) = others.next()?;
                if candidate == name {
                    at(j);
                    break;
                }
            }
        }
        Some(())
    }
}

/// Consecutive positions `first..=last`.
pub(super) struct Run {
    pub first: usize,
    pub last: usize,
}

/// The runs of consecutive positions in `at`, in order.
pub(super) fn runs(at: &[u32]) -> impl Iterator<Item = Run> + '_ {
    let mut k = 0;
    std::iter::from_fn(move || {
        let first = *at.get(k)?;
        let mut last = first;
        k += 1;
        while at
            .get(k)
            .is_some_and(|&next| Some(next) == last.checked_add(1))
        {
            last += 1;
            k += 1;
        }
        Some(Run {
            first: first as usize,
            last: last as usize,
        })
    })
}

/// Whether a name of a run (closing quotes at `ends`, the first opening at `open` of
/// `text`) needs escaping.
fn run_escapes(ends: &[u32], text: &str, mut open: usize) -> bool {
    ends.iter().any(|&end| {
        let name = text.get(open + 1..end as usize).unwrap_or("");
        open = next_open(end);
        needs_escape(name)
    })
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
                let mut names = Names::with_capacity(count, count * 19);
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

    #[test]
    fn runs_are_copied_whole_and_picked_names_are_the_ones_asked_for() {
        let plain: Names = ["a", "bb", "", "c", "e"].into_iter().collect();
        assert_eq!(plain.json_run(0, 4), br#""a","bb","","c","e""#);
        assert_eq!(plain.json_run(1, 2), br#""bb","""#);
        assert_eq!(plain.json_run(3, 3), br#""c""#);
        assert_eq!(plain.json_run(3, 2), b"");
        assert_eq!(plain.json_run(0, 5), b"");
        let of = |at: &[u32]| runs(at).map(|r| (r.first, r.last)).collect::<Vec<_>>();
        assert_eq!(of(&[0, 1, 2, 4, 6, 7]), [(0, 2), (4, 4), (6, 7)]);
        assert_eq!(of(&[]), []);
        assert_eq!(of(&[3, 3, 2]), [(3, 3), (3, 3), (2, 2)]);
        assert_eq!(of(&[u32::MAX - 1, u32::MAX]), [(0xFFFF_FFFE, 0xFFFF_FFFF)]);
        let escaped: Names = ["a", "b\"b", "", "c\\", "e"].into_iter().collect();
        for list in [&plain, &escaped] {
            let cases: [&[u32]; 8] = [
                &[],
                &[0],
                &[0, 1, 2, 3, 4],
                &[1, 2, 4],
                &[3],
                &[4, 0],
                &[2, 2],
                &[0, 2, 4],
            ];
            for at in cases {
                let picked = list.picked(at).unwrap();
                let want: Names = at.iter().map(|&i| list.get(i as usize)).collect();
                assert_eq!(picked, want, "{list:?} at {at:?}");
                assert_eq!(
                    picked.iter().collect::<Vec<_>>(),
                    want.iter().collect::<Vec<_>>()
                );
            }
            assert!(list.picked(&[5]).is_none());
            assert!(list.picked(&[1, 2, 9]).is_none());
        }
        assert!(!escaped.picked(&[0, 2, 4]).unwrap().escapes());
        assert!(escaped.picked(&[2, 3]).unwrap().escapes());
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
