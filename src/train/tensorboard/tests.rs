use super::*;
use serde_json::json;

fn scalar_events(dir: &Path) -> Vec<(i64, Vec<(String, f32)>)> {
    read_events(dir)
        .unwrap()
        .into_iter()
        .filter_map(|(_, e)| match e.what {
            What::Scalars(values) => Some((e.step, values)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_line_flattens_to_every_numeric_leaf_under_its_path() {
    let line = json!({
        "iteration": 3,
        "phase": "dapo",
        "mean_reward": 0.25,
        "resolved": 2,
        "finish": {"submitted": 5, "max_turns": 1},
        "dropped": {"deep": {"er": true}, "no": false},
        "lr_first": null,
        "task_groups_by_process": [4, 4],
        "huge": 1e300,
        "negative": -7,
    });
    let (step, values) = scalars(Series::Iterations, &line).unwrap();
    assert_eq!(step, 3);
    let expected = [
        ("iterations/mean_reward", 0.25),
        ("iterations/resolved", 2.0),
        ("iterations/finish/submitted", 5.0),
        ("iterations/finish/max_turns", 1.0),
        ("iterations/dropped/deep/er", 1.0),
        ("iterations/dropped/no", 0.0),
        ("iterations/huge", f32::INFINITY),
        ("iterations/negative", -7.0),
    ];
    let expected: Vec<(String, f32)> = expected.iter().map(|&(t, v)| (t.into(), v)).collect();
    assert_eq!(values, expected);
    let (step, values) = scalars(Series::Metrics, &json!({"step": 9, "loss": 0.1})).unwrap();
    assert_eq!((step, values), (9, vec![("metrics/loss".into(), 0.1f32)]));
    let error = scalars(Series::Metrics, &json!({"loss": 1.0}))
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("metrics.jsonl") && error.contains("`step`"),
        "{error}"
    );
}

#[test]
fn a_writer_starts_with_the_file_version_and_writes_each_line_as_an_event() {
    let dir = tempfile::tempdir().unwrap();
    let tb = dir.path().join("tb");
    let writer = EventWriter::create(&tb).unwrap();
    let name = writer
        .path()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let parts: Vec<&str> = name.split('.').collect();
    assert_eq!(&parts[..3], ["events", "out", "tfevents"], "{name}");
    assert_eq!(parts[3].len(), 10, "{name}");
    assert!(
        name.ends_with(&format!(".{}", std::process::id())),
        "{name}"
    );
    writer
        .write_line(Series::Metrics, &json!({"step": 1, "loss": 2.5}))
        .unwrap();
    // Each record is in the file as soon as it is written.
    let events = read_events(&tb).unwrap();
    assert_eq!(events.len(), 2);
    assert_eq!(events[0].1.what, What::FileVersion("brain.Event:2".into()));
    assert!(events[0].1.wall_time > 1.6e9);
    assert_eq!(
        scalar_events(&tb),
        vec![(1, vec![("metrics/loss".to_string(), 2.5)])]
    );
    // A second writer (a resume, within the same second) gets a name that sorts after.
    let second = EventWriter::create(&tb).unwrap();
    assert!(second.path() > writer.path());
    assert_eq!(event_files(&tb).unwrap().len(), 2);
    let not_a_folder = tb.join(name);
    let error = format!("{:#}", EventWriter::create(&not_a_folder).err().unwrap());
    assert!(
        error.contains(&not_a_folder.display().to_string()),
        "{error}"
    );
}

#[test]
fn a_resume_trims_each_series_past_its_checkpoint_and_writes_on_in_a_new_file() {
    let dir = tempfile::tempdir().unwrap();
    let tb = dir.path().join("tb");
    let first = EventWriter::create(&tb).unwrap();
    for iteration in 0..=4u64 {
        for s in 1..=3 {
            let step = iteration * 3 + s;
            let line = json!({"step": step, "iteration": iteration, "loss": step as f64});
            first.write_line(Series::Metrics, &line).unwrap();
        }
        let line = json!({"iteration": iteration, "mean_reward": iteration as f64 / 10.0});
        first.write_line(Series::Iterations, &line).unwrap();
    }
    // The run stops while writing a record.
    let mut file = File::options().append(true).open(first.path()).unwrap();
    file.write_all(&tf_record::frame(b"cut short")[..10])
        .unwrap();
    // Resumed after iteration 2 (step 9): what follows is dropped.
    trim(
        &tb,
        &[(Series::Iterations, Some(2)), (Series::Metrics, Some(9))],
    )
    .unwrap();
    let kept = scalar_events(&tb);
    let metric_steps: Vec<i64> = kept
        .iter()
        .filter(|(_, v)| v[0].0.starts_with("metrics/"))
        .map(|e| e.0)
        .collect();
    let iterations: Vec<i64> = kept
        .iter()
        .filter(|(_, v)| v[0].0.starts_with("iterations/"))
        .map(|e| e.0)
        .collect();
    assert_eq!(metric_steps, (1..=9).collect::<Vec<_>>());
    assert_eq!(iterations, vec![0, 1, 2]);
    let second = EventWriter::create(&tb).unwrap();
    second
        .write_line(Series::Metrics, &json!({"step": 10, "loss": 10.0}))
        .unwrap();
    assert_eq!(scalar_events(&tb).len(), 13);
    // Nothing left in a file: it goes.
    let all_but_iteration_0 = [(Series::Iterations, Some(0)), (Series::Metrics, None)];
    trim(&tb, &all_but_iteration_0).unwrap();
    let left: Vec<_> = scalar_events(&tb);
    assert_eq!(
        left,
        vec![(0, vec![("iterations/mean_reward".into(), 0.0)])]
    );
    assert_eq!(event_files(&tb).unwrap(), vec![first.path().to_path_buf()]);
    trim(&tb, &all_but_iteration_0).unwrap();
    assert_eq!(event_files(&tb).unwrap().len(), 1);
    trim(&tb, &[(Series::Iterations, None)]).unwrap();
    assert!(event_files(&tb).unwrap().is_empty());
    // No folder: nothing to trim.
    trim(&dir.path().join("none"), &[(Series::Metrics, None)]).unwrap();
}

#[test]
fn a_damaged_event_file_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let writer = EventWriter::create(dir.path()).unwrap();
    writer
        .write_line(Series::Metrics, &json!({"step": 1, "loss": 1.0}))
        .unwrap();
    let mut bytes = std::fs::read(writer.path()).unwrap();
    let last = bytes.len() - 6;
    bytes[last] ^= 0x40;
    std::fs::write(writer.path(), bytes).unwrap();
    let error = format!(
        "{:#}",
        trim(dir.path(), &[(Series::Metrics, None)]).unwrap_err()
    );
    assert!(
        error.contains(&writer.path().display().to_string()) && error.contains("checksum"),
        "{error}"
    );
}
