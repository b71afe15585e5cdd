// Cache rows row0 + r = rows src_row0 + r of k and v ([rows, width] each, width = kv_heads * head_dim, even),
// for r < n (a store file before this one defines the cache buffers and store()). One thread per pair of values.

struct Params {
    width: u32,
    n: u32,
    src_row0: u32,
    row0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> k: array<f32>;
@group(0) @binding(4) var<storage, read> v: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let e = id.y * groups.x * 64u + id.x;
    let half_width = p.width / 2u;
    if (e >= p.n * half_width) {
        return;
    }
    let r = e / half_width;
    let c = 2u * (e % half_width);
    let s = (p.src_row0 + r) * p.width + c;
    store((p.row0 + r) * p.width + c, vec2<f32>(k[s], k[s + 1u]), vec2<f32>(v[s], v[s + 1u]));
}
