//! AdamW against three `torch.optim.AdamW` steps (tests/fixtures/adamw.safetensors), gradient
//! clipping, skipped steps on NaN gradients, and the learning-rate schedules.

mod common;

use safetensors::SafeTensors;
use swerve::backend::cpu::{CpuBackend, CpuTensor};
use swerve::train::optimizer::{lr_at, AdamW, AdamWConfig, LrSchedule};

fn f32s(st: &SafeTensors<'_>, key: &str) -> CpuTensor {
    let view = st.tensor(key).unwrap();
    let data = view
        .data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    CpuTensor::new(view.shape().to_vec(), data)
}

fn f64s(st: &SafeTensors<'_>, key: &str) -> Vec<f64> {
    st.tensor(key)
        .unwrap()
        .data()
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn three_steps_equal_torch_adamw() {
    let bytes = std::fs::read(common::root().join("tests/fixtures/adamw.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let backend = CpuBackend::new();
    let names = ["weight", "bias", "norm"];
    let mut masters: Vec<CpuTensor> = names
        .iter()
        .map(|n| f32s(&st, &format!("{n}.init")))
        .collect();
    let config = AdamWConfig {
        weight_decay: f64s(&st, "weight_decay")[0] as f32,
        max_grad_norm: None,
        ..AdamWConfig::default()
    };
    let mut adamw = AdamW::new(&backend, config, &masters.iter().collect::<Vec<_>>()).unwrap();
    for (step, lr) in f64s(&st, "lr")
        .into_iter()
        .enumerate()
        .map(|(i, lr)| (i + 1, lr))
    {
        let grads: Vec<CpuTensor> = names
            .iter()
            .map(|n| f32s(&st, &format!("{n}.grad{step}")))
            .collect();
        let before: Vec<Vec<f32>> = masters.iter().map(|m| m.data.clone()).collect();
        let report = adamw
            .step(
                &backend,
                &mut masters.iter_mut().collect::<Vec<_>>(),
                &grads.iter().collect::<Vec<_>>(),
                lr,
            )
            .unwrap();
        assert!(!report.skipped && report.grad_scale == 1.0);
        for ((name, master), before) in names.iter().zip(&masters).zip(&before) {
            let want = f32s(&st, &format!("{name}.step{step}"));
            // The update itself (not just the parameters, which barely move) to 1e-5.
            let got_delta: Vec<f32> = master.data.iter().zip(before).map(|(a, b)| a - b).collect();
            let want_delta: Vec<f64> = want
                .data
                .iter()
                .zip(before)
                .map(|(a, b)| (a - b) as f64)
                .collect();
            let err = common::relative_error(&got_delta, &want_delta);
            let max_param_diff = master
                .data
                .iter()
                .zip(&want.data)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            println!("step {step} {name}: update relative error {err:.2e}, max parameter difference {max_param_diff:.1e}");
            assert!(
                err <= 1e-5,
                "step {step} {name}: update relative error {err:.3e}"
            );
            assert!(max_param_diff <= 1e-6, "step {step} {name}");
        }
    }
    assert_eq!(adamw.steps_taken, 3);
}

#[test]
fn clipping_scales_by_the_global_norm_reported_before_clipping() {
    let backend = CpuBackend::new();
    let mut masters = [
        CpuTensor::new(vec![2, 2], vec![0.0; 4]),
        CpuTensor::new(vec![1], vec![0.0]),
    ];
    let grads = [
        CpuTensor::new(vec![2, 2], vec![3.0, 0.0, 0.0, 0.0]),
        CpuTensor::new(vec![1], vec![4.0]),
    ];
    let config = AdamWConfig {
        max_grad_norm: Some(1.0),
        weight_decay: 0.0,
        ..AdamWConfig::default()
    };
    let mut adamw = AdamW::new(&backend, config, &masters.iter().collect::<Vec<_>>()).unwrap();
    let report = adamw
        .step(
            &backend,
            &mut masters.iter_mut().collect::<Vec<_>>(),
            &grads.iter().collect::<Vec<_>>(),
            0.1,
        )
        .unwrap();
    assert_eq!(report.grad_norm, 5.0);
    assert!((report.grad_scale - 1.0 / (5.0 + 1e-6)).abs() < 1e-12);
    // The first moment holds (1 - beta1) * the clipped gradient.
    let m0 = adamw.exp_avg[0].data[0];
    assert!((m0 - 0.1 * 3.0 / 5.0).abs() < 1e-6, "{m0}");
}

#[test]
fn a_nan_gradient_skips_the_step_and_changes_nothing() {
    let backend = CpuBackend::new();
    let init = CpuTensor::new(vec![2, 2], vec![1.0, 2.0, 3.0, 4.0]);
    let mut masters = [init.clone()];
    let mut adamw = AdamW::new(&backend, AdamWConfig::default(), &[&init]).unwrap();
    for bad in [f32::NAN, f32::INFINITY] {
        let grads = [CpuTensor::new(vec![2, 2], vec![0.5, bad, 0.0, 1.0])];
        let report = adamw
            .step(
                &backend,
                &mut masters.iter_mut().collect::<Vec<_>>(),
                &grads.iter().collect::<Vec<_>>(),
                0.1,
            )
            .unwrap();
        assert!(report.skipped && !report.grad_norm.is_finite());
        assert_eq!(masters[0], init);
        assert_eq!(adamw.steps_taken, 0);
        assert!(adamw.exp_avg[0]
            .data
            .iter()
            .chain(&adamw.exp_avg_sq[0].data)
            .all(|&v| v == 0.0));
    }
}

#[test]
fn schedules_warm_up_linearly_then_hold_or_decay_to_zero() {
    let lr = 1e-3;
    for schedule in [LrSchedule::Constant, LrSchedule::Cosine] {
        assert_eq!(lr_at(schedule, lr, 4, 20, 1), lr * 0.25);
        assert_eq!(lr_at(schedule, lr, 4, 20, 4), lr);
        assert_eq!(lr_at(schedule, lr, 0, 20, 1), lr);
    }
    assert_eq!(lr_at(LrSchedule::Constant, lr, 4, 20, 20), lr);
    assert_eq!(lr_at(LrSchedule::Cosine, lr, 4, 20, 5), lr);
    // Halfway through the decay: half the rate; the last step is small but not zero.
    assert!((lr_at(LrSchedule::Cosine, lr, 4, 20, 13) - lr * 0.5).abs() < 1e-12);
    let last = lr_at(LrSchedule::Cosine, lr, 4, 20, 20);
    assert!(last > 0.0 && last < lr * 0.01, "{last}");
    let mut previous = f64::INFINITY;
    for step in 5..=20 {
        let now = lr_at(LrSchedule::Cosine, lr, 4, 20, step);
        assert!(now < previous);
        previous = now;
    }
}
