set encoding utf8
set grid lc rgb '#dddddd'
set key noenhanced
set title noenhanced
set title 'Latency by percentile at 50% load (CDF, tail stretched)'
set logscale x
set logscale y
set xtics ("0" 1, "90" 10, "99" 100, "99.9" 1000, "99.99" 10000, "99.999" 100000)
set xlabel 'percentile (%)'
set ylabel 'latency (us, log)'
set key top left
plot 'latency_cdf.dat' index 0 using 2:1 with steps lw 2 title 'checkpoints off', 'latency_cdf.dat' index 1 using 2:1 with steps lw 2 title 'checkpoints every 100 ms'
