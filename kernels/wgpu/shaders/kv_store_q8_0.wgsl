// Cache rows row0 + r = rows src_row0 + r of k and v, rounded as GGML's block_q8_0 rounds them (per 32 values:
// scale amax / 127 stored as f16, quants roundf(x / scale)), kept as the f32 values q * scale that attention
// reads (the q8_0 bytes are rebuilt from them exactly on the host). One thread per block of 32 values.

struct Params {
    width: u32,  // kv_heads * head_dim, a multiple of 32
    n: u32,
    src_row0: u32,
    row0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> k: array<f32>;
@group(0) @binding(2) var<storage, read_write> k_cache: array<f32>;
@group(0) @binding(3) var<storage, read_write> v_cache: array<f32>;
@group(0) @binding(4) var<storage, read> v: array<f32>;

fn q8_0_round(x: array<f32, 32>) -> array<f32, 32> {
    var amax = 0.0;
    for (var j = 0u; j < 32u; j++) {
        amax = max(amax, abs(x[j]));
    }
    let scale = amax / 127.0;
    let inv = select(0.0, 1.0 / scale, scale != 0.0);
    let stored = unpack2x16float(pack2x16float(vec2<f32>(scale, 0.0))).x;
    var out: array<f32, 32>;
    for (var j = 0u; j < 32u; j++) {
        let q = x[j] * inv;
        out[j] = trunc(q + sign(q) * 0.5) * stored;
    }
    return out;
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let e = id.y * groups.x * 64u + id.x;
    let blocks = p.width / 32u;
    if (e >= p.n * blocks) {
        return;
    }
    let r = e / blocks;
    let s = (p.src_row0 + r) * p.width + 32u * (e % blocks);
    let d = (p.row0 + r) * p.width + 32u * (e % blocks);
    var kb: array<f32, 32>;
    var vb: array<f32, 32>;
    for (var j = 0u; j < 32u; j++) {
        kb[j] = k[s + j];
        vb[j] = v[s + j];
    }
    kb = q8_0_round(kb);
    vb = q8_0_round(vb);
    for (var j = 0u; j < 32u; j++) {
        k_cache[d + j] = kb[j];
        v_cache[d + j] = vb[j];
    }
}
