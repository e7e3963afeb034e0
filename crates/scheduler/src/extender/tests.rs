use super::evaluate::unresolvable;
use super::*;

#[test]
fn scores_spread_so_the_best_gets_ten() {
    assert_eq!(spread_scores(&[None, None]), [0, 0]);
    assert_eq!(
        spread_scores(&[Some((0, 5)), None, Some((0, 5))]),
        [10, 0, 10]
    );
    // One preference level: linear in the policy score.
    assert_eq!(
        spread_scores(&[Some((0, 100)), Some((0, 0)), Some((0, 50))]),
        [10, 0, 4]
    );
    // A better preference beats any policy score.
    let s = spread_scores(&[Some((200, 0)), Some((0, 100)), Some((0, 0))]);
    assert_eq!(s[0], 10);
    assert!(s[1] > s[2] && s[1] < 10, "{s:?}");
}

#[test]
fn filter_modes_parse() {
    assert_eq!("all".parse::<FilterMode>(), Ok(FilterMode::All));
    assert_eq!("best".parse::<FilterMode>(), Ok(FilterMode::Best));
    assert!(
        "most"
            .parse::<FilterMode>()
            .unwrap_err()
            .contains("all or best")
    );
}

#[test]
fn unresolvable_phrases() {
    assert!(unresolvable("node(s) had untolerated taint {gpu: true}"));
    assert!(unresolvable(crate::framework::volumes::NODE_CONFLICT));
    assert!(!unresolvable("Insufficient nvidia.com/gpu"));
    assert!(!unresolvable(
        "node(s) didn't have free ports for the requested pod ports"
    ));
}
