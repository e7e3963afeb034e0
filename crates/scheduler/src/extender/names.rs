//! Candidate node names as kube-scheduler sends them, kept in one buffer: thousands of
//! names per call cost two allocations instead of one each, answers refer to them by
//! position, and an unchanged list is recognised by one comparison of the buffers.

use std::fmt;

/// Node names in the order given.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Names {
    text: String,
    /// Where each name ends in `text`.
    ends: Vec<u32>,
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
        let Ok(end) = u32::try_from(self.text.len() + name.len()) else {
            return false;
        };
        self.text.push_str(name);
        self.ends.push(end);
        true
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
        }
    }
}
