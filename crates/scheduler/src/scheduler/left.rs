//! What left since the parked pods were last woken ([`super::wakes`] reads it).

/// What left since the parked pods were last woken.
#[derive(Debug, Default)]
pub(super) enum Left {
    #[default]
    Nothing,
    /// Pods left these nodes (by name) and nothing else changed.
    Nodes(Vec<String>),
    /// Something that may help any parked pod.
    Anything,
}

impl Left {
    /// Pods left `node`.
    pub(super) fn node(&mut self, node: &str) {
        match self {
            Left::Nothing => *self = Left::Nodes(vec![node.to_string()]),
            Left::Nodes(nodes) => nodes.push(node.to_string()),
            Left::Anything => {}
        }
    }

    /// Something changed that may help any parked pod.
    pub(super) fn anything(&mut self) {
        *self = Left::Anything;
    }
}
