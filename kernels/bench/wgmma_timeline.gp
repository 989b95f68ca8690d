# Renders wgmma_timeline.dat (a measured timeline of one decode CTA) as
# wgmma_timeline.png:  gnuplot kernels/bench/wgmma_timeline.gp  (from the
# repository root).
set terminal pngcairo size 1400,420 font ",11"
set output "kernels/bench/wgmma_timeline.png"
set title "DecodeWgmmaKernel of commit 0c86b52 (one producer warpgroup), one CTA of V4-Flash H=64 b=128 on the H200 (clock64 stamps)"
set xlabel "SM clock cycles since the CTA started (about 1.9 per ns)"
set ytics ("WG1: P.V [256:512]" 1, "WG0: S, softmax, P.V [0:256]" 2, "producer: chunk stored" 3)
set yrange [0.4:3.6]
set xrange [0:*]
set grid xtics
set key outside right top box
set style fill solid 0.8 border -1
data = "kernels/bench/wgmma_timeline.dat"
box(k) = (column(5) == k ? column(1) : NaN)
plot data using (($2 + $3) / 2):(box(1)):(($3 - $2) / 2):(0.3) with boxxyerror lc rgb "#999999" title "setup (slots, Q)", \
     data using (($2 + $3) / 2):(box(2)):(($3 - $2) / 2):(0.3) with boxxyerror lc rgb "#d95f02" title "producer: loads wait + dequantise", \
     data using (($2 + $3) / 2):(box(3)):(($3 - $2) / 2):(0.3) with boxxyerror lc rgb "#1b9e77" title "S = Q K^T", \
     data using (($2 + $3) / 2):(box(4)):(($3 - $2) / 2):(0.3) with boxxyerror lc rgb "#7570b3" title "softmax, P", \
     data using (($2 + $3) / 2):(box(5)):(($3 - $2) / 2):(0.3) with boxxyerror lc rgb "#e7298a" title "P.V", \
     data using (($2 + $3) / 2):(box(6)):(($3 - $2) / 2):(0.3) with boxxyerror lc rgb "#66a61e" title "output"
