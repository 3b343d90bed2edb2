set encoding utf8
set grid lc rgb '#dddddd'
set key noenhanced
set title noenhanced
set title 'Throughput and p99 latency over time (checkpoints every 100 ms, one failure)'
set multiplot layout 2,1
set xrange [0:20]
set arrow from 10.0023, graph 0 to 10.0023, graph 1 nohead lc rgb 'red' lw 2
set label 'failure' at 10.0023, graph 0.95 offset 0.5,0 tc rgb 'red'
set ylabel 'M records/s'
set format x ''
set key top right
set yrange [0:*]
plot 'timeline.dat' index 0 using 1:2 with steps lw 1.5 title 'throughput', 'timeline.dat' index 1 using 1:(0):(0):(1.2605840000000001) with vectors nohead lc rgb '#888888' title 'checkpoint completed'
unset title
set format x '%g'
set xlabel 'time (s)'
set ylabel 'p99 latency (us, log)'
set logscale y
plot 'timeline.dat' index 0 using 1:3 with steps lw 1.5 lc rgb '#0072b2' title 'p99 per interval'
unset multiplot
