//! The closest known name to a mistyped one (edit distance), for "did you mean" hints.

/// Levenshtein distance between `a` and `b`, in characters.
pub(crate) fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut current = vec![i + 1; b.len() + 1];
        for (j, &cb) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(ca != cb);
            current[j + 1] = substitution.min(previous[j + 1] + 1).min(current[j] + 1);
        }
        previous = current;
    }
    previous[b.len()]
}

/// The name of `names` closest to `typed`, when it is close: within a third of the longer
/// name's length in edits (at least 1), or one name the start of the other
/// (`tasks-per-iter` for `tasks-per-iteration`). Ties go to the first listed.
pub(crate) fn closest<'a>(typed: &str, names: &[&'a str]) -> Option<&'a str> {
    let typed_dashes = typed.replace('_', "-");
    names
        .iter()
        .map(|&name| (edit_distance(&typed_dashes, name), name))
        .filter(|&(distance, name)| {
            let longer = name.chars().count().max(typed.chars().count());
            let prefix = typed_dashes.len() >= 3
                && (name.starts_with(&typed_dashes) || typed_dashes.starts_with(name));
            distance <= (longer / 3).max(1) || prefix
        })
        .min_by_key(|&(distance, _)| distance)
        .map(|(_, name)| name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edit_distance_counts_insertions_deletions_and_substitutions() {
        assert_eq!(edit_distance("", ""), 0);
        assert_eq!(edit_distance("lr", ""), 2);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("batch-size", "bach-size"), 1);
        assert_eq!(edit_distance("group", "groups"), 1);
    }

    #[test]
    fn a_close_name_is_suggested_and_a_far_one_is_not() {
        let names = [
            "lr",
            "rft-lr",
            "batch-size",
            "rft-batch-size",
            "tasks-per-iteration",
        ];
        assert_eq!(closest("batch-szie", &names), Some("batch-size"));
        assert_eq!(closest("batch_size", &names), Some("batch-size"));
        assert_eq!(closest("rft-batchsize", &names), Some("rft-batch-size"));
        assert_eq!(
            closest("tasks-per-iter", &names),
            Some("tasks-per-iteration")
        );
        assert_eq!(closest("lf", &names), Some("lr"));
        assert_eq!(closest("temperature", &names), None);
    }
}
