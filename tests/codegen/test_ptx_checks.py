"""attngen.bench.ptx.unfenced_descriptor_loads on PTX shaped as ptxas gets it from Triton 3.6 (the
lines below are taken from the sm90 compiles of the Gluon backward over packed documents, cut down):
a TMA copy through a descriptor the kernel made is flagged unless an acquire fence of its own
warp-specialized stretch covered that address; host descriptors never are."""

from attngen.bench.ptx import unfenced_barrier_inits, unfenced_descriptor_loads, uninvalidated_barriers

# the entry: warp 0 of the first consumer makes a descriptor in global scratch and acquires it
ENTRY = """
.visible .entry k(
	.param .u64 .ptr .global .align 1 k_param_0,
	.param .u64 .ptr .global .align 1 k_param_46
)
{
	ld.param.b64 	%rd23, [k_param_46];
	ld.param.b64 	%rd24, [k_param_0];
	cvta.param.u64 	%rd2, %rd24;
	add.s64 	%rd171, %rd23, %rd178;
	@%p79 tensormap.replace.tile.global_address.shared::cta.b1024.b64 [ %rd167 + 0 ], %rd168;
	@%p78 tensormap.cp_fenceproxy.global.shared::cta.tensormap::generic.release.gpu.sync.aligned [ %rd171 + 0 ], [ %rd167 + 0 ], 0x80;
	@%p78 fence.proxy.tensormap::generic.acquire.gpu [ %rd171 + 0 ], 0x80;
	bar.sync 	0, 128;
	@%p80 cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%r713], [%rd2, {%r714, %r715, %r716, %r1552}], [%r702];
"""
# the producer partition: the same scratch address computed again, loads through it
PRODUCER = """
	setmaxnreg.dec.sync.aligned.u32 	24;
	barrier.sync 	1;
	add.s64 	%rd28, %rd23, %rd27;
	add.s64 	%rd29, %rd28, 128;
	cvta.global.u64 	%rd40, %rd29;
	cvta.global.u64 	%rd39, %rd28;
{acquire}	@%p7 cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%r116], [%rd39, {{%r109, %r1422, %r117, %r109}}], [%r115];
	@%p8 cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%r121], [%rd40, {{%r109, %r1422, %r117, %r109}}], [%r120];
}}
"""


def test_a_partition_loading_through_a_descriptor_another_warp_acquired_is_flagged():
    ptx = ENTRY + PRODUCER.format(acquire="")
    out = unfenced_descriptor_loads(ptx)
    want = [f"line {n}" for n, line in enumerate(ptx.splitlines(), 1) if "[%rd39," in line or "[%rd40," in line]
    assert [line.split(":")[0] for line in out] == want and len(want) == 2, out
    assert "[%rd39," in out[0] and "[%rd40," in out[1]


def test_the_partitions_own_acquire_covers_its_loads_and_only_the_acquired_address():
    one = "\t@%p3 fence.proxy.tensormap::generic.acquire.gpu [ %rd28 + 0 ], 0x80;\n"
    out = unfenced_descriptor_loads(ENTRY + PRODUCER.format(acquire=one))
    assert len(out) == 1 and "[%rd40," in out[0], out  # %rd29 (the second descriptor) not acquired
    both = one + "\t@%p3 fence.proxy.tensormap::generic.acquire.gpu [ %rd29 + 0 ], 0x80;\n"
    assert unfenced_descriptor_loads(ENTRY + PRODUCER.format(acquire=both)) == []


def test_an_acquire_before_the_partition_starts_does_not_count_inside_it():
    early = ENTRY.replace("add.s64 \t%rd171", "add.s64 \t%rd28").replace("%rd171 + 0", "%rd28 + 0")
    assert "acquire.gpu [ %rd28 + 0 ]" in early
    assert len(unfenced_descriptor_loads(early + PRODUCER.format(acquire=""))) == 2


def test_host_descriptors_and_a_single_stretch_kernel_pass():
    # the entry alone: its one load goes through a kernel parameter (cvta.param)
    assert unfenced_descriptor_loads(ENTRY + "}\n") == []
    # a kernel without partitions that makes, acquires and loads through one descriptor
    own = ENTRY + ("\tcvta.global.u64 \t%rd50, %rd171;\n"
                   "\t@%p9 cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes "
                   "[%r1], [%rd50, {%r2, %r3, %r4, %r5}], [%r6];\n}\n")
    assert unfenced_descriptor_loads(own) == []


def test_stores_and_reduces_through_an_unacquired_descriptor_are_flagged():
    tail = ("\tsetmaxnreg.inc.sync.aligned.u32 \t240;\n"
            "\tcvta.global.u64 \t%rd60, %rd171;\n"
            "\tcp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%rd60, {%r1, %r2, %r3, %r4}], [%r5];\n"
            "\tcp.reduce.async.bulk.tensor.4d.global.shared::cta.add.bulk_group [%rd60, {%r1, %r2, %r3, %r4}], [%r5];\n"
            "}\n")
    out = unfenced_descriptor_loads(ENTRY + tail)
    assert len(out) == 2 and "bulk_group [%rd60" in out[0] and "cp.reduce" in out[1], out


# the Gluon entry as Triton 3.6 emits it: barriers initialised by one thread, the block's barrier,
# the captures, then the partitions (each starts with setmaxnreg); a consumer's first copy
INITS = """
	@%p80 mbarrier.init.shared::cta.b64 [%r712], 1;
	@%p80 mbarrier.init.shared::cta.b64 [%r713], 2;
{fence}	bar.sync 	0, 128;
	st.shared.v2.b64 	[global_smem+132096], {{%rd10, %rd12}};
	barrier.sync 	1;
	setmaxnreg.dec.sync.aligned.u32 	240;
	@%p12 cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%r150], [%rd2, {{%r151, %r152, %r153, %r1395}}], [%r149];
"""


def test_barrier_inits_without_a_proxy_fence_before_the_partitions_are_flagged():
    ptx = INITS.format(fence="")
    out = unfenced_barrier_inits(ptx)
    assert len(out) == 1 and "[%r713], 2" in out[0], out  # the run's last initialisation
    want = next(n for n, line in enumerate(ptx.splitlines(), 1) if "[%r713]" in line)
    assert out[0].startswith(f"line {want}:")


def test_a_proxy_fence_after_the_inits_clears_them():
    assert unfenced_barrier_inits(INITS.format(fence="\tfence.proxy.async.shared::cta;\n")) == []
    assert unfenced_barrier_inits(INITS.format(fence="\tfence.mbarrier_init.release.cluster;\n")) == []
    # a fence before the initialisations does not count
    early = "\tfence.proxy.async.shared::cta;\n" + INITS.format(fence="")
    assert len(unfenced_barrier_inits(early)) == 1


def test_a_copy_with_no_partitions_after_unfenced_inits_is_flagged_and_later_inits_count_again():
    single = ("\t@%p1 mbarrier.init.shared::cta.b64 [%r33], 1;\n\tbar.sync \t0;\n"
              "\t@%p2 cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%r1], [%rd1, {%r2, %r3}], [%r33];\n")
    assert len(unfenced_barrier_inits(single)) == 1
    fenced = INITS.format(fence="\tfence.proxy.async.shared::cta;\n")
    assert len(unfenced_barrier_inits(fenced + single)) == 1  # the second run has no fence of its own


def test_uninvalidated_barriers_counts_inits_without_an_inval():
    inits = "\tmbarrier.init.shared::cta.b64 [%r1], 1;\n\tmbarrier.init.shared::cta.b64 [%r2], 2;\n"
    assert uninvalidated_barriers(inits) == 2
    one = inits + "\tmbarrier.inval.shared::cta.b64 [%r1];\n"
    assert uninvalidated_barriers(one) == 1
    assert uninvalidated_barriers(one + "\t@%p3 mbarrier.inval.shared::cta.b64 [%r2];\n") == 0
    assert uninvalidated_barriers("\tbar.sync 0;\n") == 0
