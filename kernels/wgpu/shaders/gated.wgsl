// out = act(gate) * up elementwise; act 0 is SiLU, 1 GELU (tanh approximation, as written by the CPU kernels:
// v / (1 + exp(-2u))).

struct Params {
    total: u32,
    act: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> gate: array<f32>;
@group(0) @binding(2) var<storage, read> up: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

const GELU_C2: f32 = 1.5957691216057308;  // 2 * sqrt(2 / pi)

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let e = id.y * groups.x * 64u + id.x;
    if (e >= p.total) {
        return;
    }
    let g = gate[e];
    var z = -g;
    if (p.act == 1u) {
        z = -GELU_C2 * (g + 0.044715 * g * g * g);
    }
    out[e] = g / (1.0 + exp(z)) * up[e];
}
