// Write n rows of k and v (kv_heads * head_dim floats each, row r of src at r * stride + k_offset / v_offset) into
// the cache at rows row0.. (a store file before this one defines the cache buffers and store()). One thread per
// pair of values.

struct Params {
    width: u32,  // kv_heads * head_dim, even
    n: u32,
    stride: u32,
    k_offset: u32,
    v_offset: u32,
    row0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let e = id.y * groups.x * 64u + id.x;
    let half_width = p.width / 2u;
    if (e >= p.n * half_width) {
        return;
    }
    let r = e / half_width;
    let c = 2u * (e % half_width);
    let dst = (p.row0 + r) * p.width + c;
    let s = r * p.stride + c;
    store(dst, vec2<f32>(src[s + p.k_offset], src[s + p.k_offset + 1u]),
          vec2<f32>(src[s + p.v_offset], src[s + p.v_offset + 1u]));
}
