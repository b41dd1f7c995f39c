//! `docs/decisions/README.md` is the index of the decision records: every
//! record in the folder has a row there, linked by its file name, so that a
//! new record cannot land without one.

use std::path::Path;

#[test]
fn every_decision_record_has_a_row_in_the_index() {
    let folder = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/decisions");
    let index = std::fs::read_to_string(folder.join("README.md")).expect("the index");
    let mut unlisted = Vec::new();
    let mut record_count = 0;
    for entry in std::fs::read_dir(&folder).expect("docs/decisions") {
        let name = entry.expect("a directory entry").file_name();
        let name = name.to_string_lossy();
        let numbered = name.len() > 5 && name[..4].bytes().all(|byte| byte.is_ascii_digit());
        if !numbered || !name.ends_with(".md") {
            continue;
        }
        record_count += 1;
        let row_start = format!("| [{}]({name}) |", &name[..4]);
        if !index.lines().any(|line| line.starts_with(&row_start)) {
            unlisted.push(name.into_owned());
        }
    }
    assert!(record_count > 0, "no decision records found in {folder:?}");
    unlisted.sort();
    assert!(
        unlisted.is_empty(),
        "decision records without a row in docs/decisions/README.md: {unlisted:?}"
    );
}
