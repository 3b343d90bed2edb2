set encoding utf8
set grid lc rgb '#dddddd'
set key noenhanced
set title noenhanced
set title 'Ring throughput by batch size (median, min-max)'
set logscale x 2
set xlabel 'batch (records)'
set ylabel 'M records/s'
set key top left
plot 'ring.dat' index 0 using 1:2:3:4 with yerrorlines title 'sluice', 'ring.dat' index 1 using 1:2:3:4 with yerrorlines title 'spsc', 'ring.dat' index 2 using 1:2:3:4 with yerrorlines title 'mutex', 'ring.dat' index 3 using 1:2:3:4 with yerrorlines title 'wfcq'
