//! prioritize's answer: the candidates' ranking keys spread over kube-scheduler's 0-10.

/// Scores 0-10 for ranked keys (preference sum, then policy score): the best key gets 10,
/// the worst 0, the others in between by rank of preference then linearly by policy score;
/// `None` (does not fit) gets 0.
pub fn spread_scores(keys: &[Option<(i64, i64)>]) -> Vec<i64> {
    let mut fitting = keys.iter().flatten();
    let Some(&first) = fitting.next() else {
        return vec![0; keys.len()];
    };
    // One pass: the best and worst keys, the policy scores' range, and whether the
    // preference sums differ at all (usually not: then there is one level, and no sort).
    let (mut best, mut worst, mut lo, mut hi, mut one_level) =
        (first, first, first.1, first.1, true);
    for &k in fitting {
        best = best.max(k);
        worst = worst.min(k);
        lo = lo.min(k.1);
        hi = hi.max(k.1);
        one_level &= k.0 == first.0;
    }
    if best == worst {
        return keys
            .iter()
            .map(|k| if k.is_some() { 10 } else { 0 })
            .collect();
    }
    // Distinct preference levels, best first; within one level the policy score decides.
    let levels: Vec<i64> = if one_level {
        vec![first.0]
    } else {
        let mut levels: Vec<i64> = keys.iter().flatten().map(|k| k.0).collect();
        levels.sort_unstable_by(|a, b| b.cmp(a));
        levels.dedup();
        levels
    };
    keys.iter()
        .map(|k| {
            let Some((pref, score)) = *k else {
                return 0;
            };
            if (pref, score) == best {
                return 10;
            }
            // Position in [0, 1]: preference level first, the policy's score within it.
            // `levels` is sorted best (largest) first.
            let level = levels.binary_search_by(|l| pref.cmp(l)).unwrap_or(0) as f64;
            let within = if hi > lo {
                (score - lo) as f64 / (hi - lo) as f64
            } else {
                1.0
            };
            let position = (levels.len() as f64 - 1.0 - level + within) / levels.len() as f64;
            (position * 9.0).floor().clamp(0.0, 9.0) as i64
        })
        .collect()
}
