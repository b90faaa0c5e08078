//! The viewer reads files by path within the input limit every reader applies
//! (`CACHALOT_MAX_INPUT_BYTES`): a file over it is a notice naming the file and the limit,
//! not a read that runs until memory is gone. One test in its own binary, because it sets the
//! process's environment.

#![cfg(not(target_arch = "wasm32"))]

use cachalot_viewer::ViewerApp;

#[test]
fn a_file_over_the_input_limit_is_a_notice_naming_the_limit() {
    let trace =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/traces/pytorch-2.11-h200/seeds.pickle");
    let size = std::fs::metadata(&trace).expect("the reference trace").len();
    // SAFETY: the only test of this binary, before any thread that reads the environment.
    unsafe { std::env::set_var("CACHALOT_MAX_INPUT_BYTES", (size - 1).to_string()) };

    let mut app = ViewerApp::new();
    app.open_path(trace.clone());
    app.wait_for_loads();
    let expected = format!("{size} bytes is more than the input limit of {} bytes", size - 1);
    let notice = app.notices.iter().find(|n| n.error).expect("a notice says why the file was not opened");
    assert!(notice.text.contains("seeds.pickle") && notice.text.contains(&expected), "{}", notice.text);
    assert!(app.active_tab().is_none());

    // SAFETY: as above; the loads of the first half have finished.
    unsafe { std::env::set_var("CACHALOT_MAX_INPUT_BYTES", size.to_string()) };
    app.notices.clear();
    app.open_path(trace.clone());
    app.wait_for_loads();
    assert!(app.notices.iter().all(|n| !n.error), "{:?}", app.notices);
    assert!(app.active_tab().is_some());
}
